#include "common/worker_limits.h"

#include <set>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "common/utf8.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// 'abc', or its first 40 bytes and how long it was.
std::string Quote(absl::string_view s) {
  if (s.size() <= 40) return absl::StrCat("'", s, "'");
  return absl::StrCat("'", s.substr(0, 40), "...' (", s.size(), " bytes)");
}

absl::Status CheckRange(absl::string_view field, int64_t value, int64_t low, int64_t high) {
  if (value >= low && value <= high) return absl::OkStatus();
  return Bad(field, absl::StrCat("must be in [", low, ", ", high, "], got ", value));
}

absl::Status CheckLength(absl::string_view field, absl::string_view s, size_t min, size_t max) {
  if (s.size() < min) return Bad(field, "required");
  if (s.size() > max) return Bad(field, absl::StrCat("at most ", max, " bytes, got ", s.size()));
  return absl::OkStatus();
}

// Each byte is a letter, a digit or one of `extra`.
absl::Status CheckChars(absl::string_view field, absl::string_view s, absl::string_view extra) {
  for (char c : s) {
    if (!absl::ascii_isalnum(c) && extra.find(c) == absl::string_view::npos) {
      return Bad(field, absl::StrCat(Quote(s), " may hold only letters, digits and '", extra, "'"));
    }
  }
  return absl::OkStatus();
}

// An identifier: 1..kMaxIdBytes, no control characters.
absl::Status CheckId(absl::string_view field, absl::string_view s, bool required = true) {
  if (absl::Status st = CheckLength(field, s, required ? 1 : 0, kMaxIdBytes); !st.ok()) return st;
  for (char c : s) {
    if (absl::ascii_iscntrl(c)) return Bad(field, absl::StrCat(Quote(s), ": control character"));
  }
  return absl::OkStatus();
}

// Free text (already UTF-8: protobuf checks that when it parses).
absl::Status CheckText(absl::string_view field, absl::string_view s, size_t max) {
  if (!IsValidUtf8(s)) return Bad(field, "not UTF-8");
  return CheckLength(field, s, 0, max);
}

absl::Status CheckState(absl::string_view field, int state) {
  if (state == v1::TASK_STATE_UNSPECIFIED || !v1::TaskState_IsValid(state)) {
    return Bad(field, absl::StrCat("unknown task state ", state));
  }
  return absl::OkStatus();
}

bool Ended(int state) {
  return state == v1::TASK_STATE_SUCCEEDED || state == v1::TASK_STATE_FAILED ||
         state == v1::TASK_STATE_CANCELLED;
}

absl::Status CheckResources(const v1::NodeResources& r, int* slots) {
  if (r.gpus_size() > kMaxNodeSlots) {
    return Bad("register.resources.gpus",
               absl::StrCat("at most ", kMaxNodeSlots, " GPUs, got ", r.gpus_size()));
  }
  std::set<int> indices;
  for (int i = 0; i < r.gpus_size(); ++i) {
    const v1::GpuInfo& gpu = r.gpus(i);
    const std::string f = absl::StrCat("register.resources.gpus[", i, "]");
    RETURN_IF_ERROR(CheckRange(f + ".index", gpu.index(), 0, kMaxNodeSlots - 1));
    if (!indices.insert(gpu.index()).second) {
      return Bad(f + ".index", absl::StrCat("GPU ", gpu.index(), " listed twice"));
    }
    RETURN_IF_ERROR(CheckId(f + ".uuid", gpu.uuid(), /*required=*/false));
    RETURN_IF_ERROR(CheckId(f + ".name", gpu.name(), /*required=*/false));
    RETURN_IF_ERROR(CheckRange(f + ".memory_total_bytes", gpu.memory_total_bytes(), 0, INT64_MAX));
  }
  if (r.gpus_size() > 0) {
    RETURN_IF_ERROR(CheckRange("register.resources.cpu_slots", r.cpu_slots(), 0, kMaxNodeSlots));
    *slots = r.gpus_size();
  } else {
    if (r.cpu_slots() < 1 || r.cpu_slots() > kMaxNodeSlots) {
      return Bad("register.resources.cpu_slots",
                 absl::StrCat("must be in [1, ", kMaxNodeSlots, "] on a node without GPUs, got ",
                              r.cpu_slots()));
    }
    *slots = r.cpu_slots();
  }
  return absl::OkStatus();
}

absl::Status CheckRunningTasks(const v1::RegisterWorker& reg, int node_slots) {
  if (reg.running_tasks_size() > kMaxNodeSlots) {
    return Bad("register.running_tasks",
               absl::StrCat("at most ", kMaxNodeSlots, " tasks, got ", reg.running_tasks_size()));
  }
  std::set<std::string> ids;
  int64_t live_slots = 0;
  for (int i = 0; i < reg.running_tasks_size(); ++i) {
    const v1::RunningTask& t = reg.running_tasks(i);
    const std::string f = absl::StrCat("register.running_tasks[", i, "]");
    RETURN_IF_ERROR(CheckId(f + ".task_id", t.task_id()));
    if (!ids.insert(t.task_id()).second) {
      return Bad(f + ".task_id", absl::StrCat(Quote(t.task_id()), " listed twice"));
    }
    RETURN_IF_ERROR(CheckId(f + ".job_id", t.job_id()));
    RETURN_IF_ERROR(CheckRange(f + ".attempt", t.attempt(), 0, INT32_MAX));
    RETURN_IF_ERROR(CheckRange(f + ".node_rank", t.node_rank(), 0, kMaxRank - 1));
    RETURN_IF_ERROR(CheckRange(f + ".slots", t.slots(), 1, kMaxNodeSlots));
    RETURN_IF_ERROR(CheckState(f + ".state", t.state()));
    RETURN_IF_ERROR(CheckRange(f + ".master_port", t.master_port(), 0, 65535));
    if (!Ended(t.state())) live_slots += t.slots();
  }
  if (live_slots > node_slots) {
    return Bad("register.running_tasks", absl::StrCat("tasks still running hold ", live_slots,
                                                      " slots, the node has ", node_slots));
  }
  return absl::OkStatus();
}

absl::Status CheckTaskStatus(const v1::TaskStatus& s) {
  RETURN_IF_ERROR(CheckId("task_status.task_id", s.task_id()));
  RETURN_IF_ERROR(CheckId("task_status.job_id", s.job_id()));
  RETURN_IF_ERROR(CheckState("task_status.state", s.state()));
  RETURN_IF_ERROR(CheckRange("task_status.failed_rank", s.failed_rank(), -1, kMaxRank - 1));
  RETURN_IF_ERROR(CheckRange("task_status.signal", s.signal(), 0, 128));
  RETURN_IF_ERROR(CheckRange("task_status.master_port", s.master_port(), 0, 65535));
  RETURN_IF_ERROR(CheckRange("task_status.attempt", s.attempt(), 0, INT32_MAX));
  RETURN_IF_ERROR(CheckText("task_status.message", s.message(), kMaxMessageBytes));
  if (s.last_log_lines_size() > kMaxStatusTailLines) {
    return Bad("task_status.last_log_lines", absl::StrCat("at most ", kMaxStatusTailLines,
                                                          " lines, got ", s.last_log_lines_size()));
  }
  for (int i = 0; i < s.last_log_lines_size(); ++i) {
    RETURN_IF_ERROR(CheckText(absl::StrCat("task_status.last_log_lines[", i, "]"),
                              s.last_log_lines(i), kMaxLineBytes));
  }
  return absl::OkStatus();
}

absl::Status CheckLogs(const v1::LogBatch& logs) {
  if (logs.lines_size() > kMaxLogBatchLines) {
    return Bad("logs.lines",
               absl::StrCat("at most ", kMaxLogBatchLines, " lines, got ", logs.lines_size()));
  }
  for (int i = 0; i < logs.lines_size(); ++i) {
    const v1::LogLine& l = logs.lines(i);
    const std::string f = absl::StrCat("logs.lines[", i, "]");
    RETURN_IF_ERROR(CheckId(f + ".job_id", l.job_id()));
    RETURN_IF_ERROR(CheckRange(f + ".rank", l.rank(), 0, kMaxRank - 1));
    if (l.stream() != "stdout" && l.stream() != "stderr") {
      return Bad(f + ".stream", absl::StrCat("must be stdout or stderr, got ", Quote(l.stream())));
    }
    RETURN_IF_ERROR(CheckText(f + ".text", l.text(), kMaxLineBytes));
  }
  return absl::OkStatus();
}

absl::Status CheckEvent(const v1::TrainerEvent& e) {
  RETURN_IF_ERROR(CheckId("event.job_id", e.job_id()));
  RETURN_IF_ERROR(CheckRange("event.attempt", e.attempt(), 0, INT32_MAX));
  RETURN_IF_ERROR(CheckRange("event.rank", e.rank(), 0, kMaxRank - 1));
  return CheckText("event.json", e.json(), kMaxLineBytes);
}

absl::Status CheckWarning(const v1::WorkerWarning& w) {
  RETURN_IF_ERROR(CheckId("warning.job_id", w.job_id(), /*required=*/false));
  RETURN_IF_ERROR(CheckId("warning.task_id", w.task_id(), /*required=*/false));
  return CheckText("warning.message", w.message(), kMaxMessageBytes);
}

absl::Status CheckCount(absl::string_view field, int count, int max) {
  if (count <= max) return absl::OkStatus();
  return Bad(field, absl::StrCat("at most ", max, ", got ", count));
}

}  // namespace

absl::Status CheckNodeTopology(absl::string_view field, const v1::NodeTopology& t) {
  const std::string f(field);
  RETURN_IF_ERROR(CheckId(f + ".node", t.node(), /*required=*/false));
  RETURN_IF_ERROR(CheckCount(f + ".gpus", t.gpus_size(), kMaxNodeSlots));
  for (int i = 0; i < t.gpus_size(); ++i) {
    const v1::TopologyGpu& gpu = t.gpus(i);
    const std::string g = absl::StrCat(f, ".gpus[", i, "]");
    RETURN_IF_ERROR(CheckRange(g + ".index", gpu.index(), 0, kMaxNodeSlots - 1));
    RETURN_IF_ERROR(CheckId(g + ".uuid", gpu.uuid(), false));
    RETURN_IF_ERROR(CheckId(g + ".name", gpu.name(), false));
    RETURN_IF_ERROR(CheckId(g + ".pci_bus_id", gpu.pci_bus_id(), false));
    if (gpu.memory_total_bytes() < 0) return Bad(g + ".memory_total_bytes", "negative");
  }
  RETURN_IF_ERROR(CheckCount(f + ".devices", t.devices_size(), kMaxTopologyDevices));
  for (int i = 0; i < t.devices_size(); ++i) {
    const v1::TopologyDevice& d = t.devices(i);
    const std::string g = absl::StrCat(f, ".devices[", i, "]");
    RETURN_IF_ERROR(CheckId(g + ".name", d.name()));
    RETURN_IF_ERROR(CheckId(g + ".nic_device", d.nic_device(), false));
    RETURN_IF_ERROR(CheckId(g + ".cpu_affinity", d.cpu_affinity(), false));
    RETURN_IF_ERROR(CheckId(g + ".numa_affinity", d.numa_affinity(), false));
  }
  const int n = t.devices_size();
  RETURN_IF_ERROR(CheckCount(f + ".links", t.links_size(), n * (n - 1) / 2));
  for (int i = 0; i < t.links_size(); ++i) {
    const v1::TopologyLink& l = t.links(i);
    const std::string g = absl::StrCat(f, ".links[", i, "]");
    RETURN_IF_ERROR(CheckRange(g + ".a", l.a(), 0, n - 1));
    RETURN_IF_ERROR(CheckRange(g + ".b", l.b(), l.a() + 1, n - 1));
    if (!v1::LinkType_IsValid(l.type()) || l.type() == v1::LINK_TYPE_UNSPECIFIED) {
      return Bad(g + ".type", absl::StrCat("unknown link type ", l.type()));
    }
    RETURN_IF_ERROR(CheckRange(g + ".nvlinks", l.nvlinks(), 0, 1024));
  }
  RETURN_IF_ERROR(CheckCount(f + ".rdma_ports", t.rdma_ports_size(), kMaxTopologyRdmaPorts));
  for (int i = 0; i < t.rdma_ports_size(); ++i) {
    const v1::RdmaPort& p = t.rdma_ports(i);
    const std::string g = absl::StrCat(f, ".rdma_ports[", i, "]");
    RETURN_IF_ERROR(CheckId(g + ".device", p.device()));
    RETURN_IF_ERROR(CheckRange(g + ".port", p.port(), 0, 1 << 16));
    for (const std::string* s : {&p.state(), &p.phys_state(), &p.rate(), &p.link_layer()}) {
      RETURN_IF_ERROR(CheckId(g, *s, false));
    }
    if (!(p.rate_gbps() >= 0 && p.rate_gbps() <= 1e6)) {
      return Bad(g + ".rate_gbps", absl::StrCat("must be in [0, 1e6], got ", p.rate_gbps()));
    }
    RETURN_IF_ERROR(CheckCount(g + ".netdevs", p.netdevs_size(), kMaxTopologyInterfaces));
    for (const std::string& netdev : p.netdevs()) RETURN_IF_ERROR(CheckId(g + ".netdevs", netdev));
  }
  RETURN_IF_ERROR(CheckId(f + ".peer_memory_module", t.peer_memory_module(), false));
  RETURN_IF_ERROR(CheckCount(f + ".nccl_env", t.nccl_env_size(), kMaxTopologyEnv));
  for (const auto& [name, value] : t.nccl_env()) {
    RETURN_IF_ERROR(CheckId(f + ".nccl_env key", name));
    RETURN_IF_ERROR(CheckText(absl::StrCat(f, ".nccl_env[", Quote(name), "]"), value,
                              kMaxTopologyTextBytes));
  }
  RETURN_IF_ERROR(CheckText(f + ".topo_matrix", t.topo_matrix(), kMaxTopoMatrixBytes));
  RETURN_IF_ERROR(CheckCount(f + ".probe_errors", t.probe_errors_size(), kMaxTopologyProbeErrors));
  for (const std::string& e : t.probe_errors()) {
    RETURN_IF_ERROR(CheckText(f + ".probe_errors", e, kMaxTopologyTextBytes));
  }
  RETURN_IF_ERROR(CheckCount(f + ".interfaces", t.interfaces_size(), kMaxTopologyInterfaces));
  for (const auto& [name, value] : t.interfaces()) {
    RETURN_IF_ERROR(CheckId(f + ".interfaces key", name));
    RETURN_IF_ERROR(CheckId(absl::StrCat(f, ".interfaces[", Quote(name), "]"), value, false));
  }
  return absl::OkStatus();
}

absl::Status CheckRegisterWorker(const v1::RegisterWorker& reg) {
  RETURN_IF_ERROR(CheckLength("register.node_name", reg.node_name(), 1, kMaxNodeNameBytes));
  RETURN_IF_ERROR(CheckChars("register.node_name", reg.node_name(), "._-"));
  if (!absl::ascii_isalnum(reg.node_name()[0])) {
    return Bad("register.node_name",
               absl::StrCat(Quote(reg.node_name()), " must start with a letter or digit"));
  }
  RETURN_IF_ERROR(
      CheckLength("register.advertise_addr", reg.advertise_addr(), 1, kMaxAddressBytes));
  RETURN_IF_ERROR(CheckChars("register.advertise_addr", reg.advertise_addr(), "._:-[]"));
  if (reg.labels_size() > kMaxNodeLabels) {
    return Bad("register.labels",
               absl::StrCat("at most ", kMaxNodeLabels, " labels, got ", reg.labels_size()));
  }
  for (const auto& [key, value] : reg.labels()) {
    const std::string f = absl::StrCat("register.labels[", Quote(key), "]");
    RETURN_IF_ERROR(CheckLength(f + " key", key, 1, kMaxLabelBytes));
    RETURN_IF_ERROR(CheckChars(f + " key", key, "._/:-"));
    RETURN_IF_ERROR(CheckLength(f, value, 0, kMaxLabelBytes));
    RETURN_IF_ERROR(CheckChars(f, value, "._/:-"));
  }
  int slots = 0;
  RETURN_IF_ERROR(CheckResources(reg.resources(), &slots));
  RETURN_IF_ERROR(CheckRunningTasks(reg, slots));
  return CheckId("register.boot_id", reg.boot_id());
}

absl::Status CheckWorkerMessage(const v1::WorkerMessage& message) {
  if (message.seq() < 0) {
    return Bad("seq", absl::StrCat("must not be negative, got ", message.seq()));
  }
  switch (message.msg_case()) {
    case v1::WorkerMessage::kHeartbeat:
      return absl::OkStatus();
    case v1::WorkerMessage::kTaskStatus:
      return CheckTaskStatus(message.task_status());
    case v1::WorkerMessage::kLogs:
      return CheckLogs(message.logs());
    case v1::WorkerMessage::kEvent:
      return CheckEvent(message.event());
    case v1::WorkerMessage::kWarning:
      return CheckWarning(message.warning());
    case v1::WorkerMessage::kTopology:
      return CheckNodeTopology("topology", message.topology());
    case v1::WorkerMessage::kRegister:
      return CheckRegisterWorker(message.register_());
    default:
      return Bad("msg", "the message carries nothing this coordinator knows");
  }
}

}  // namespace trainctl
