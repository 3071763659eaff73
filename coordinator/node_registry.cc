#include "coordinator/node_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/worker_limits.h"

namespace trainctl {

namespace v1 = trainctl::v1;

void NodeRegistry::MessageArrived(int64_t session, absl::Time now) {
  absl::MutexLock lock(&heard_mu_);
  Heard& h = heard_[session];
  h.last = std::max(h.last, now);
  h.holding = true;
}

void NodeRegistry::MessageReleased(int64_t session, absl::Time now) {
  absl::MutexLock lock(&heard_mu_);
  auto it = heard_.find(session);
  if (it == heard_.end()) return;  // the session is gone
  it->second.last = std::max(it->second.last, now);
  it->second.holding = false;
}

void NodeRegistry::SessionEnded(int64_t session) {
  absl::MutexLock lock(&heard_mu_);
  auto it = heard_.find(session);
  if (it != heard_.end()) it->second.holding = false;
}

void NodeRegistry::AddSession(int64_t session, std::shared_ptr<WorkerChannel> channel) {
  sessions_[session] = std::move(channel);
}

std::shared_ptr<WorkerChannel> NodeRegistry::SessionChannel(int64_t session) const {
  auto it = sessions_.find(session);
  return it == sessions_.end() ? nullptr : it->second;
}

void NodeRegistry::RemoveSession(int64_t session) {
  sessions_.erase(session);
  if (WorkerNode* node = ForSession(session)) Detach(*node);
  absl::MutexLock lock(&heard_mu_);
  heard_.erase(session);
}

void NodeRegistry::Detach(WorkerNode& node) {
  if (node.session != 0) {
    absl::MutexLock lock(&heard_mu_);
    auto it = heard_.find(node.session);
    if (it != heard_.end()) {
      node.last_seen = std::max(node.last_seen, it->second.last);
      heard_.erase(it);
    }
  }
  sessions_.erase(node.session);
  node.session = 0;
  node.channel = nullptr;
  if (node.parked) {
    std::function<void()> done = std::move(node.parked->done);
    node.parked.reset();
    done();
  }
}

absl::Time NodeRegistry::LastSeen(const WorkerNode& node, absl::Time now) const {
  if (node.session == 0) return node.last_seen;
  absl::MutexLock lock(&heard_mu_);
  auto it = heard_.find(node.session);
  if (it == heard_.end()) return node.last_seen;
  if (it->second.holding) return now;
  return std::max(node.last_seen, it->second.last);
}

std::vector<std::pair<std::string, absl::Duration>> NodeRegistry::ExpiredLeases(absl::Time now) {
  std::vector<std::pair<std::string, absl::Duration>> expired;
  for (const auto& [name, node] : nodes_) {
    if (node.lost) continue;
    const absl::Duration silent = now - LastSeen(node, now);
    if (silent > lease_timeout_) {
      expired.emplace_back(name, silent);
      if (lease_misses_ != nullptr) lease_misses_->Increment();
    }
  }
  return expired;
}

WorkerNode* NodeRegistry::ForSession(int64_t session) {
  if (session == 0) return nullptr;
  for (auto& [name, node] : nodes_) {
    if (node.session == session) return &node;
  }
  return nullptr;
}

WorkerNode* NodeRegistry::Find(const std::string& name) {
  auto it = nodes_.find(name);
  return it == nodes_.end() ? nullptr : &it->second;
}

absl::Status NodeRegistry::MayRegister(int64_t session, const v1::RegisterWorker& reg,
                                       absl::Time now) {
  if (absl::Status s = CheckRegisterWorker(reg); !s.ok()) return s;
  if (WorkerNode* current = ForSession(session)) {
    return absl::FailedPreconditionError(absl::StrCat("register: this session is already node ",
                                                      current->name, "; one register per session"));
  }
  WorkerNode* node = Find(reg.node_name());
  if (node == nullptr || node->session == 0 || node->channel == nullptr) return absl::OkStatus();
  const absl::Duration silent = now - LastSeen(*node, now);
  if (node->boot_id == reg.boot_id()) {
    // The same worker process, reconnecting before its old stream was seen to break.
    node->channel->Close(absl::UnavailableError("replaced by a newer session of the same worker"));
    return absl::OkStatus();
  }
  if (!node->lost && silent <= lease_timeout_) {
    return absl::AlreadyExistsError(absl::StrCat(
        "register: node ", node->name, " has a live session (another worker process, heard from ",
        absl::FormatDuration(silent), " ago; lease ", absl::FormatDuration(lease_timeout_),
        "); a second worker cannot take its name while it lives"));
  }
  node->channel->Close(absl::FailedPreconditionError(absl::StrCat(
      "node ", node->name, " was taken over by another worker process (", reg.advertise_addr(),
      ") after this session sent nothing for ", absl::FormatDuration(silent))));
  return absl::OkStatus();
}

WorkerNode& NodeRegistry::Register(int64_t session, const v1::RegisterWorker& reg, absl::Time now,
                                   bool* was_lost) {
  WorkerNode& node = nodes_[reg.node_name()];
  Detach(node);  // a stream it had before (replaced) is no longer its
  const bool new_boot = node.boot_id != reg.boot_id();
  node.name = reg.node_name();
  node.address = reg.advertise_addr();
  node.labels = {reg.labels().begin(), reg.labels().end()};
  node.gpus = reg.resources().gpus_size();
  node.gpu_memory_bytes = 0;
  for (const auto& gpu : reg.resources().gpus()) {
    if (gpu.memory_total_bytes() > 0 &&
        (node.gpu_memory_bytes == 0 || gpu.memory_total_bytes() < node.gpu_memory_bytes)) {
      node.gpu_memory_bytes = gpu.memory_total_bytes();
    }
  }
  node.total_slots = node.gpus > 0 ? node.gpus : reg.resources().cpu_slots();
  node.session = session;
  node.channel = SessionChannel(session);
  node.last_seen = std::max(node.last_seen, now);
  if (new_boot) {
    // Seqs are comparable within one boot only; what the old process sent is its own affair.
    node.boot_id = reg.boot_id();
    node.applied_seq = 0;
    node.acks.Clear();
  }
  *was_lost = node.lost;
  node.lost = false;
  return node;
}

}  // namespace trainctl
