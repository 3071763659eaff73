#include "worker/daemon/worker.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/json_proto.h"
#include "common/logging.h"
#include "common/rank_env.h"
#include "common/utf8.h"
#include "common/worker_limits.h"
#include "google/protobuf/util/time_util.h"
#include "worker/daemon/rank_user.h"

namespace trainctl::worker {
namespace {

namespace v1 = trainctl::v1;
namespace fs = std::filesystem;
using google::protobuf::util::TimeUtil;

static_assert(kMaxRankLineBytes <= kMaxLineBytes && kRankTailLines <= kMaxStatusTailLines);
// Sessions in a row that may end with the same message unacknowledged before it is set aside.
constexpr int kPoisonSessions = 3;

google::protobuf::Timestamp NowProto() {
  return TimeUtil::MicrosecondsToTimestamp(absl::ToUnixMicros(absl::Now()));
}

std::string NewBootId() {
  std::random_device rd;
  return absl::StrCat(absl::ToUnixMicros(absl::Now()), "-", getpid(), "-", rd());
}

// A TCP port free on `addr` a moment ago, for the job's rendezvous (TCPStore) on this node.
absl::StatusOr<int> PickPort(const std::string& addr) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError("socket() failed");
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = 0;
  if (inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1) sa.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(sa);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0;
  close(fd);
  if (!ok) return absl::UnavailableError(absl::StrCat("cannot bind a port on ", addr));
  return static_cast<int>(ntohs(sa.sin_port));
}

// Writes the launch as the coordinator decided it, untouched, to <dir>/launch.json (every rank's
// `train --launch`); returns its path.
absl::StatusOr<fs::path> WriteLaunchFile(const fs::path& dir, const v1::LaunchTask& launch) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  const fs::path launch_path = dir / "launch.json";
  std::ofstream out(launch_path);
  out << MessageToJsonText(launch, /*pretty=*/true) << "\n";
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", launch_path.string()));
  return launch_path;
}

// The job's rendezvous port: picked here on node rank 0, else the one the launch names.
absl::StatusOr<int> RendezvousPort(const v1::LaunchTask& launch,
                                   const std::string& advertise_addr) {
  if (launch.node_rank() != 0) return launch.master_port();
  return PickPort(advertise_addr);
}

v1::TaskState StateOf(const GangResult& result) {
  if (result.succeeded) return v1::TASK_STATE_SUCCEEDED;
  if (result.cancelled) return v1::TASK_STATE_CANCELLED;
  return v1::TASK_STATE_FAILED;
}

}  // namespace

Worker::Worker(WorkerOptions options)
    : options_(std::move(options)),
      output_roots_(options_.output_roots, options_.work_dir),
      boot_id_(NewBootId()),
      outbox_((fs::path(options_.work_dir) / "outbox.spill").string(),
              options_.outbox_memory_bytes),
      link_({options_.coordinators, options_.credentials, options_.token, options_.token_file,
             options_.connect_timeout}),
      coordinator_(options_.coordinators.front()) {
  for (const v1::GpuInfo& gpu : options_.gpus) free_gpus_.insert(gpu.index());
  free_cpu_slots_ = options_.cpu_slots;
}

Worker::~Worker() {
  Stop();
  // Gangs are destroyed here, outside mu_ (their threads call back into the worker).
  std::vector<std::shared_ptr<Gang>> gangs;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, task] : tasks_) gangs.push_back(std::move(task.gang));
    tasks_.clear();
  }
  gangs.clear();
}

void Worker::Run() {
  std::error_code ec;
  fs::create_directories(fs::path(options_.work_dir) / "tasks", ec);
  if (options_.probe_topology) {
    v1::NodeTopology topology = options_.probe_topology();
    absl::MutexLock lock(&mu_);
    topology_ = std::move(topology);
  }
  std::thread flusher([this] { FlushLoop(); });
  std::thread prober([this] { ProbeLoop(); });
  absl::Duration backoff = options_.reconnect_min;
  std::mt19937 rng(std::random_device{}());
  while (!closing_) {
    const absl::Time started = absl::Now();
    const bool registered = Session();
    if (closing_) break;
    if (absl::Now() - started > absl::Seconds(10)) backoff = options_.reconnect_min;
    // The rest of the round goes at once: a standby refuses in a moment, and the one that leads
    // is found without waiting out a back-off per address.
    if (!link_.EndAttempt(registered)) continue;
    // Full jitter, so a fleet of workers does not reconnect in lockstep after a coordinator
    // restart.
    std::uniform_real_distribution<double> jitter(0.5, 1.0);
    const absl::Time until = absl::Now() + backoff * jitter(rng);
    while (!closing_ && absl::Now() < until) {
      ReportLoopPass();
      absl::SleepFor(absl::Milliseconds(20));
    }
    backoff = std::min(backoff * 2, options_.reconnect_max);
  }
  flusher.join();
  prober.join();
}

void Worker::Stop() {
  if (stopping_.exchange(true)) return;
  std::vector<std::shared_ptr<Gang>> gangs;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, task] : tasks_) {
      if (task.gang != nullptr && !task.gang->done()) {
        task.cancel_reason = "worker shutting down";
        gangs.push_back(task.gang);
      }
    }
  }
  for (auto& gang : gangs) gang->Cancel();
  const absl::Time deadline = absl::Now() + options_.kill_grace + absl::Seconds(5);
  for (auto& gang : gangs) {
    while (!gang->done() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  }
  {
    absl::MutexLock lock(&mu_);
    FlushLogsLocked();
  }
  // Give the session a moment to deliver the ranks' final lines and statuses.
  const absl::Time drain = absl::Now() + absl::Seconds(3);
  while (outbox_.held() > 0 && absl::Now() < drain) absl::SleepFor(absl::Milliseconds(20));
  closing_ = true;
  absl::MutexLock lock(&mu_);
  if (context_ != nullptr) context_->TryCancel();
  outbox_.Close();
}

void Worker::ReportLoopPass() {
  if (!options_.on_loop) return;
  WorkerLoopSummary summary;
  summary.registered = connected_;
  summary.coordinator = coordinator_;
  {
    absl::MutexLock lock(&mu_);
    summary.tasks = static_cast<int>(tasks_.size());
  }
  options_.on_loop(summary);
}

WorkerStats Worker::Stats() {
  WorkerStats stats;
  stats.connected = connected_;
  stats.reconnects = std::max<int64_t>(0, sessions_registered_ - 1);
  stats.slots = options_.gpus.empty() ? options_.cpu_slots : static_cast<int>(options_.gpus.size());
  stats.outbox_messages = static_cast<int64_t>(outbox_.held());
  stats.outbox_spilled_bytes = outbox_.spilled_bytes();
  absl::MutexLock lock(&mu_);
  for (const auto& [id, task] : tasks_) {
    if (task.state != v1::TASK_STATE_RUNNING || task.gang == nullptr) continue;
    ++stats.tasks;
    const std::vector<pid_t> pids = task.gang->pids();
    for (size_t i = 0; i < pids.size(); ++i) {
      stats.ranks.push_back(RankProcess{task.launch.job_id(), id,
                                        task.launch.first_rank() + static_cast<int>(i), pids[i]});
    }
  }
  return stats;
}

void Worker::FlushLoop() {
  while (!closing_) {
    absl::SleepFor(options_.log_flush_interval);
    absl::MutexLock lock(&mu_);
    FlushLogsLocked();
  }
}

void Worker::ProbeLoop() {
  while (!closing_) {
    {
      absl::MutexLock lock(&mu_);
      auto asked = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return probe_requested_ || closing_; };
      // closing_ is not under mu_: the timeout bounds how long a Stop goes unnoticed.
      mu_.AwaitWithTimeout(absl::Condition(&asked), absl::Milliseconds(200));
      if (!probe_requested_ || closing_) continue;
      probe_requested_ = false;
    }
    v1::NodeTopology topology = options_.probe_topology();
    TRAINCTL_LOG(INFO) << "topology probed (" << topology.gpus_size() << " GPUs, "
                       << topology.rdma_ports_size() << " RDMA ports, "
                       << topology.probe_errors_size() << " probe errors); sending it";
    v1::WorkerMessage message;
    *message.mutable_topology() = topology;
    absl::MutexLock lock(&mu_);
    topology_ = std::move(topology);
    outbox_.Push(std::move(message));
  }
}

v1::WorkerMessage Worker::MakeRegister() {
  v1::WorkerMessage message;
  v1::RegisterWorker* reg = message.mutable_register_();
  reg->set_node_name(options_.node_name);
  reg->set_advertise_addr(options_.advertise_addr);
  reg->mutable_labels()->insert(options_.labels.begin(), options_.labels.end());
  for (const v1::GpuInfo& gpu : options_.gpus) *reg->mutable_resources()->add_gpus() = gpu;
  reg->mutable_resources()->set_cpu_slots(options_.gpus.empty() ? options_.cpu_slots : 0);
  reg->set_boot_id(boot_id_);
  absl::MutexLock lock(&mu_);
  if (options_.probe_topology) *reg->mutable_topology() = topology_;
  for (const auto& [id, task] : tasks_) {
    v1::RunningTask* rt = reg->add_running_tasks();
    rt->set_task_id(id);
    rt->set_job_id(task.launch.job_id());
    rt->set_attempt(task.launch.attempt());
    rt->set_node_rank(task.launch.node_rank());
    rt->set_slots(task.launch.slots());
    rt->set_state(task.state);
    rt->set_master_port(task.master_port);
  }
  return message;
}

bool Worker::Session() {
  CoordinatorLink::Attempt attempt = link_.Connect();
  coordinator_ = attempt.address;
  if (attempt.reach == ChannelReach::kSilent) {
    TRAINCTL_LOG(WARNING) << "no connection to " << coordinator_ << " within "
                          << absl::FormatDuration(options_.connect_timeout) << "; trying again";
    return false;
  }
  // A channel that failed to connect fails the call at once, with gRPC's reason.
  auto stub = v1::WorkerService::NewStub(attempt.channel);
  grpc::ClientContext context;
  if (const std::string& token = link_.Token(); !token.empty()) {
    context.AddMetadata("authorization", "Bearer " + token);
  }
  {
    absl::MutexLock lock(&mu_);
    if (closing_) return false;
    context_ = &context;
  }
  auto stream = stub->Session(&context);
  std::atomic<bool> broken{false};
  std::atomic<bool> registered{false};
  int64_t sent = 0;
  std::thread reader;
  if (stream->Write(MakeRegister())) {
    TRAINCTL_LOG(INFO) << "connected to " << coordinator_ << " as " << options_.node_name;
    reader = std::thread([&] { ReadSession(stream.get(), &broken, &registered); });
    sent = WriteSession(stream.get(), &broken);
    stream->WritesDone();
  }
  // A failed write or read means the call is over and the reader ends by itself; Finish then has
  // the coordinator's status (why it ended the session). Only our own stop must cancel the call.
  if (closing_) context.TryCancel();
  if (reader.joinable()) reader.join();
  connected_ = false;
  const grpc::Status status = stream->Finish();
  {
    absl::MutexLock lock(&mu_);
    context_ = nullptr;
  }
  if (!closing_) OnSessionEnded(status, sent, registered);
  return registered;
}

void Worker::ReadSession(SessionStream* stream, std::atomic<bool>* broken,
                         std::atomic<bool>* registered) {
  v1::CoordinatorMessage message;
  while (stream->Read(&message)) {
    if (message.has_registered() && !registered->exchange(true)) {
      ++sessions_registered_;
      connected_ = true;
    }
    Handle(message);
  }
  *broken = true;
}

int64_t Worker::WriteSession(SessionStream* stream, std::atomic<bool>* broken) {
  // Everything not yet acknowledged goes again, in order; then new messages and heartbeats.
  int64_t sent = outbox_.acked_through();
  absl::Time next_heartbeat = absl::Now() + options_.heartbeat_interval;
  while (!*broken && !closing_) {
    ReportLoopPass();
    const absl::Time deadline = std::min(next_heartbeat, absl::Now() + absl::Milliseconds(100));
    for (v1::WorkerMessage& m : outbox_.WaitNext(sent, 64, deadline)) {
      const int64_t seq = m.seq();
      if (!stream->Write(m)) {
        *broken = true;
        break;
      }
      sent = seq;
    }
    if (!*broken && absl::Now() >= next_heartbeat) {
      v1::WorkerMessage hb;
      *hb.mutable_heartbeat()->mutable_time() = NowProto();
      if (!stream->Write(hb)) *broken = true;
      next_heartbeat = absl::Now() + options_.heartbeat_interval;
    }
  }
  return sent;
}

void Worker::OnSessionEnded(const grpc::Status& status, int64_t sent, bool registered) {
  TRAINCTL_LOG(WARNING) << "session with " << coordinator_ << " ended: " << status.error_message()
                        << "; reconnecting";
  // A coordinator going away (UNAVAILABLE) or unable to store right now (RESOURCE_EXHAUSTED)
  // says nothing against the message it did not acknowledge: it is sent again, however often.
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
      status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) {
    CountStrike(sent, registered, status.error_message());
  }
}

void Worker::CountStrike(int64_t sent_through, bool registered, const std::string& why) {
  const int64_t first = outbox_.first_held();
  if (!registered || first == 0 || first > sent_through) return;  // not its fault
  if (first != strike_seq_) {
    strike_seq_ = first;
    strikes_ = 0;
  }
  if (++strikes_ < kPoisonSessions) return;
  strikes_ = 0;
  SetAside(first, absl::StrCat("the coordinator ended ", kPoisonSessions,
                               " sessions in a row without acknowledging it (last: ",
                               why.empty() ? "no reason given" : why, ")"));
}

void Worker::SetAside(int64_t seq, const std::string& reason) {
  auto message = outbox_.SetAside(seq);
  if (!message.ok()) return;  // acknowledged meanwhile
  const fs::path dir = fs::path(options_.work_dir) / "set-aside";
  const fs::path path = dir / absl::StrCat(boot_id_, "-", seq, ".pb");
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::ofstream out(path, std::ios::binary);
  out << message->SerializeAsString();
  out.close();
  const std::string kept = out ? absl::StrCat("kept in ", path.string())
                               : absl::StrCat("could not be kept (", path.string(), ")");
  // What it was about: its jobs (and task, for a status, which the coordinator then fails).
  std::set<std::string> jobs;
  std::string task_id, kind = "message";
  if (message->has_logs()) {
    kind = absl::StrCat("batch of ", message->logs().lines_size(), " log lines");
    for (const v1::LogLine& line : message->logs().lines()) jobs.insert(line.job_id());
  } else if (message->has_event()) {
    kind = absl::StrCat("trainer event of rank ", message->event().rank());
    jobs.insert(message->event().job_id());
  } else if (message->has_task_status()) {
    kind = absl::StrCat("status of task ", message->task_status().task_id());
    jobs.insert(message->task_status().job_id());
    task_id = message->task_status().task_id();
  } else if (message->has_warning()) {
    kind = "warning";
  } else if (message->has_topology()) {
    kind = "topology probe";
  }
  const std::string text =
      ToValidUtf8(absl::StrCat("worker ", options_.node_name, " set aside a ", kind, " (seq ", seq,
                               "): ", reason, "; ", kept));
  TRAINCTL_LOG(WARNING) << text;
  if (message->has_warning()) return;  // never a warning about a warning
  if (jobs.empty()) jobs.insert("");
  for (const std::string& job_id : jobs) {
    v1::WorkerMessage warning;
    warning.mutable_warning()->set_job_id(ToValidUtf8(job_id.substr(0, kMaxIdBytes)));
    warning.mutable_warning()->set_task_id(ToValidUtf8(task_id.substr(0, kMaxIdBytes)));
    warning.mutable_warning()->set_message(
        text.substr(0, Utf8PrefixLength(text, kMaxMessageBytes)));
    outbox_.Push(std::move(warning));
  }
}

void Worker::Handle(const v1::CoordinatorMessage& message) {
  if (message.has_launch()) {
    HandleLaunch(message.launch());
  } else if (message.has_cancel()) {
    HandleCancel(message.cancel());
  } else if (message.has_ack()) {
    HandleAck(message.ack().through_seq());
  } else if (message.has_probe_topology()) {
    absl::MutexLock lock(&mu_);
    if (options_.probe_topology) probe_requested_ = true;
  } else if (message.has_reject()) {
    SetAside(message.reject().seq(),
             absl::StrCat("the coordinator rejected it: ", message.reject().reason()));
  }
}

void Worker::HandleLaunch(const v1::LaunchTask& launch) {
  const std::string& id = launch.task_id();
  absl::MutexLock lock(&mu_);
  if (tasks_.count(id) || stopping()) return;  // a duplicate
  Task& task = tasks_[id];
  task.launch = launch;
  if (absl::Status s = CheckLaunch(launch); !s.ok()) {
    return FailLaunchLocked(task, std::string(s.message()));
  }
  const int slots = std::max(1, launch.slots());
  if (absl::Status s = ReserveSlotsLocked(task, slots); !s.ok()) {
    return FailLaunchLocked(task, std::string(s.message()));
  }
  const fs::path dir = fs::path(options_.work_dir) / "tasks" / id;
  absl::StatusOr<fs::path> launch_path = WriteLaunchFile(dir, launch);
  if (!launch_path.ok()) return FailLaunchLocked(task, std::string(launch_path.status().message()));
  absl::StatusOr<int> port = RendezvousPort(launch, options_.advertise_addr);
  if (!port.ok()) return FailLaunchLocked(task, std::string(port.status().message()));
  task.master_port = launch.node_rank() == 0 ? *port : 0;
  StartRanksLocked(launch, MakeRankSpecs(task, slots, dir, *launch_path, *port), slots, *port);
}

void Worker::FailLaunchLocked(Task& task, const std::string& why) {
  TRAINCTL_LOG(WARNING) << "task " << task.launch.task_id() << ": " << why;
  task.state = v1::TASK_STATE_FAILED;
  v1::TaskStatus status;
  status.set_state(v1::TASK_STATE_FAILED);
  status.set_failed_rank(-1);
  status.set_exit_code(-1);
  status.set_message(ToValidUtf8(why.substr(0, Utf8PrefixLength(why, kMaxMessageBytes))));
  PushStatus(task, std::move(status));
}

absl::Status Worker::CheckLaunch(const v1::LaunchTask& launch) {
  if (absl::Status s = output_roots_.Check(launch.spec()); !s.ok()) return s;
  // Again here: the spec may come from a coordinator that allows more, or checks nothing.
  if (auto refused = RankEnvErrors(launch.spec().env(), options_.rank_env, "spec.env");
      !refused.empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat("refused by this worker: ", absl::StrJoin(refused, "; ")));
  }
  if (options_.rank_user.has_value() && !launch.spec().output_dir().empty()) {
    return MakeRankOutputDir(launch.spec().output_dir(), *options_.rank_user);
  }
  return absl::OkStatus();
}

absl::Status Worker::ReserveSlotsLocked(Task& task, int slots) {
  if (!options_.gpus.empty()) {
    if (static_cast<int>(free_gpus_.size()) < slots) {
      return absl::ResourceExhaustedError(
          absl::StrCat("needs ", slots, " GPUs, ", free_gpus_.size(), " free"));
    }
    for (int i = 0; i < slots; ++i) {
      task.gpus.push_back(*free_gpus_.begin());
      free_gpus_.erase(free_gpus_.begin());
    }
  } else {
    if (free_cpu_slots_ < slots) {
      return absl::ResourceExhaustedError(
          absl::StrCat("needs ", slots, " slots, ", free_cpu_slots_, " free"));
    }
    free_cpu_slots_ -= slots;
    task.cpu_slots = slots;
  }
  return absl::OkStatus();
}

std::vector<RankSpec> Worker::MakeRankSpecs(const Task& task, int slots, const fs::path& dir,
                                            const fs::path& launch_path, int port) const {
  const v1::LaunchTask& launch = task.launch;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::string threads = absl::StrCat(std::max(1u, cores / static_cast<unsigned>(slots)));
  std::vector<RankSpec> ranks;
  for (int local = 0; local < slots; ++local) {
    RankSpec rank;
    rank.rank = launch.first_rank() + local;
    rank.argv = {options_.trainer_bin, "train", "--launch", launch_path.string()};
    // The job's own variables first: the launch contract below always wins.
    rank.env.insert(launch.spec().env().begin(), launch.spec().env().end());
    if (options_.gpus.empty()) {
      rank.env.emplace("OMP_NUM_THREADS", threads);  // unless the job set it
    } else {
      rank.env["CUDA_VISIBLE_DEVICES"] = absl::StrCat(task.gpus[local]);
    }
    RankEnv contract;  // common/rank_env.h: what the trainer's main reads back
    contract.rank = rank.rank;
    contract.local_rank = local;
    contract.world_size = launch.world_size();
    contract.local_world_size = slots;
    contract.node_rank = launch.node_rank();
    contract.master_addr = launch.master_addr();
    contract.master_port = port;
    contract.node_addr = options_.advertise_addr;
    contract.job_id = launch.job_id();
    contract.task_id = launch.task_id();
    contract.attempt = launch.attempt();
    for (auto& [name, value] : contract.WorkerVariables()) rank.env[name] = std::move(value);
    rank.log_path = (dir / absl::StrCat("rank-", rank.rank, ".log")).string();
    rank.max_log_bytes = options_.max_rank_log_bytes;
    rank.user = options_.rank_user;
    ranks.push_back(std::move(rank));
  }
  return ranks;
}

Gang::Callbacks Worker::MakeGangCallbacks(const v1::LaunchTask& launch) {
  const std::string job_id = launch.job_id();
  const int attempt = launch.attempt();
  const std::string id = launch.task_id();
  Gang::Callbacks callbacks;
  callbacks.on_log = [this, job_id](int rank, const std::string& stream, std::string line) {
    OnLog(job_id, rank, stream, std::move(line));
  };
  callbacks.on_event = [this, job_id, attempt](int rank, std::string line) {
    v1::WorkerMessage message;
    v1::TrainerEvent* event = message.mutable_event();
    event->set_job_id(job_id);
    event->set_attempt(attempt);
    event->set_rank(rank);
    event->set_json(ToValidUtf8(line));
    outbox_.Push(std::move(message));
  };
  callbacks.on_exit = [this, id](const GangResult& result) { OnExit(id, result); };
  return callbacks;
}

void Worker::StartRanksLocked(const v1::LaunchTask& launch, std::vector<RankSpec> ranks, int slots,
                              int port) {
  const std::string& id = launch.task_id();
  Gang::Callbacks callbacks = MakeGangCallbacks(launch);
  // Started without mu_: the gang's thread calls back into the worker.
  mu_.Unlock();
  auto gang = Gang::Start(std::move(ranks), std::move(callbacks), options_.kill_grace);
  mu_.Lock();
  Task& started = tasks_.at(id);
  if (!gang.ok()) return FailLaunchLocked(started, std::string(gang.status().message()));
  started.gang = std::shared_ptr<Gang>(std::move(*gang));
  if (started.state != v1::TASK_STATE_STARTING) return;  // already ended (OnExit ran)
  if (stopping()) {
    // Stop() began while the ranks were being started and did not see them: stop them too.
    started.cancel_reason = "worker shutting down";
    std::shared_ptr<Gang> late = started.gang;
    mu_.Unlock();
    late->Cancel();
    mu_.Lock();
  }
  started.state = v1::TASK_STATE_RUNNING;
  TRAINCTL_LOG(INFO) << "task " << id << ": started ranks " << launch.first_rank() << ".."
                     << launch.first_rank() + slots - 1 << " of " << launch.world_size()
                     << " (rendezvous " << launch.master_addr() << ":" << port << ")";
  v1::TaskStatus status;
  status.set_state(v1::TASK_STATE_RUNNING);
  status.set_master_port(started.master_port);
  PushStatus(started, std::move(status));
}

void Worker::PushStatus(const Task& task, v1::TaskStatus status) {
  status.set_task_id(task.launch.task_id());
  status.set_job_id(task.launch.job_id());
  status.set_attempt(task.launch.attempt());
  v1::WorkerMessage message;
  *message.mutable_task_status() = std::move(status);
  const bool final = message.task_status().state() != v1::TASK_STATE_RUNNING &&
                     message.task_status().state() != v1::TASK_STATE_STARTING;
  const int64_t seq = outbox_.Push(std::move(message));
  if (final) {
    Task& t = tasks_.at(task.launch.task_id());
    t.final_seq = seq;
    // Its resources are free again as soon as its ranks are gone.
    for (int gpu : t.gpus) free_gpus_.insert(gpu);
    t.gpus.clear();
    free_cpu_slots_ += t.cpu_slots;
    t.cpu_slots = 0;
  }
}

void Worker::HandleCancel(const v1::CancelTask& cancel) {
  std::shared_ptr<Gang> gang;
  {
    absl::MutexLock lock(&mu_);
    auto it = tasks_.find(cancel.task_id());
    if (it == tasks_.end()) return;
    it->second.cancel_reason = cancel.reason();
    gang = it->second.gang;
  }
  TRAINCTL_LOG(INFO) << "task " << cancel.task_id() << ": cancel (" << cancel.reason() << ")";
  if (gang != nullptr) gang->Cancel();
}

void Worker::HandleAck(int64_t through_seq) {
  outbox_.Ack(through_seq);
  std::vector<std::shared_ptr<Gang>> finished;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = tasks_.begin(); it != tasks_.end();) {
      if (it->second.final_seq > 0 && it->second.final_seq <= through_seq) {
        finished.push_back(std::move(it->second.gang));
        it = tasks_.erase(it);
      } else {
        ++it;
      }
    }
  }
  finished.clear();  // joins their supervisor threads, outside mu_
}

void Worker::OnExit(const std::string& task_id, const GangResult& result) {
  absl::MutexLock lock(&mu_);
  auto it = tasks_.find(task_id);
  if (it != tasks_.end()) {
    const v1::LaunchTask& launch = it->second.launch;
    for (const RankExit& exit : result.exits) {
      ReportHeldBackLocked(launch.job_id(), exit.rank, /*ended=*/true);
    }
  }
  FlushLogsLocked();  // a task's lines reach the coordinator before its end
  if (it == tasks_.end()) return;
  Task& task = it->second;
  v1::TaskStatus status;
  status.set_state(StateOf(result));
  task.state = status.state();
  status.set_failed_rank(-1);
  if (result.first_failure.has_value()) {
    status.set_failed_rank(result.first_failure->rank);
    status.set_exit_code(result.first_failure->exit_code);
    status.set_signal(result.first_failure->signal);
    for (const std::string& line : result.first_failure->last_lines) {
      status.add_last_log_lines(ToValidUtf8(line));
    }
  }
  if (result.cancelled) status.set_message(task.cancel_reason);
  TRAINCTL_LOG(INFO) << "task " << task_id << " ended: " << v1::TaskState_Name(status.state())
                     << (result.first_failure
                             ? absl::StrCat(" (rank ", status.failed_rank(), " exit ",
                                            status.exit_code(), " signal ", status.signal(), ")")
                             : "");
  PushStatus(task, std::move(status));
}

}  // namespace trainctl::worker
