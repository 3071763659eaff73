// What the worker daemon tells its /metrics at each scrape: a snapshot of its session, outbox,
// tasks and rank processes, taken under its lock (Worker::Stats) and read without it.
#ifndef TRAINCTL_WORKER_DAEMON_WORKER_STATS_H_
#define TRAINCTL_WORKER_DAEMON_WORKER_STATS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace trainctl::worker {

// One live rank process of a task on this node.
struct RankProcess {
  std::string job_id;
  std::string task_id;
  int rank = 0;   // global rank
  pid_t pid = 0;  // also its process group id (each rank leads its own group)
};

struct WorkerStats {
  bool connected = false;  // registered with the coordinator on the current session
  int64_t reconnects = 0;  // sessions registered after the first
  int slots = 0;           // GPUs, or CPU slots on a node without GPUs
  int tasks = 0;           // tasks whose ranks are running
  int64_t outbox_messages = 0;
  int64_t outbox_spilled_bytes = 0;
  std::vector<RankProcess> ranks;
};

}  // namespace trainctl::worker

#endif  // TRAINCTL_WORKER_DAEMON_WORKER_STATS_H_
