#include "worker/trainer/diagnostics/bandwidth_probe.h"

#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/diagnostics_reports.h"
#include "common/diagnostics_spec.h"
#include "common/status_macros.h"
#include "worker/trainer/model/status_guard.h"

namespace trainctl::trainer {
namespace {

namespace v1 = trainctl::v1;

constexpr const char* kCollectives[] = {"all_reduce", "all_gather", "reduce_scatter"};
constexpr int64_t kHostBytes = 64;

// One collective of `numel` float32 elements (the whole buffer), started and waited for.
void RunOnce(zero::Comm& comm, const std::string& collective, const torch::Tensor& whole,
             const torch::Tensor& part) {
  if (collective == "all_reduce") return comm.AllReduce(whole, "bandwidth probe").Wait();
  if (collective == "all_gather") return comm.AllGather(part, whole, "bandwidth probe").Wait();
  comm.ReduceScatter(whole, part, "bandwidth probe").Wait();
}

void Synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// Every rank's `mine` (same length everywhere), rank after rank.
torch::Tensor GatherAll(zero::Comm& comm, const torch::Tensor& mine) {
  torch::Tensor out = torch::empty({mine.numel() * comm.world_size()}, mine.options());
  comm.AllGather(mine, out, "bandwidth probe results").Wait();
  return out.cpu();
}

}  // namespace

double BusBandwidthFactor(const std::string& collective, int world) {
  const double n = world;
  if (collective == "all_reduce") return 2 * (n - 1) / n;
  return (n - 1) / n;
}

BandwidthProbeOptions BandwidthProbeOptionsFor(const v1::DiagnosticsSpec& spec,
                                               const std::string& backend,
                                               const std::string& host) {
  BandwidthProbeOptions options;
  options.sizes.assign(spec.probe_sizes().begin(), spec.probe_sizes().end());
  if (options.sizes.empty()) options.sizes = DefaultProbeSizes(backend == "nccl");
  options.iterations =
      spec.has_probe_iterations() ? spec.probe_iterations() : kDefaultProbeIterations;
  options.host = host;
  return options;
}

absl::StatusOr<v1::BandwidthReport> RunBandwidthProbe(zero::Comm& comm, const torch::Device& device,
                                                      const BandwidthProbeOptions& options) {
  if (options.iterations < 1 || options.iterations > kMaxProbeIterations || options.warmup < 0) {
    return absl::InvalidArgumentError(absl::StrCat("bandwidth probe: iterations must be in [1, ",
                                                   kMaxProbeIterations, "], got ",
                                                   options.iterations));
  }
  if (options.sizes.empty() || static_cast<int>(options.sizes.size()) > kMaxProbeSizes) {
    return absl::InvalidArgumentError(absl::StrCat("bandwidth probe: 1 to ", kMaxProbeSizes,
                                                   " sizes, got ", options.sizes.size()));
  }
  const int world = comm.world_size();
  const auto floats = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  v1::BandwidthReport report;
  report.set_world_size(world);
  report.set_backend(comm.backend());
  report.set_dtype("float32");
  report.set_iterations(options.iterations);
  std::vector<double> mine;  // this rank's mean time per row, in microseconds
  RETURN_IF_ERROR(model::Guarded("bandwidth probe", [&]() -> absl::Status {
    for (int64_t size : options.sizes) {
      if (size < kMinProbeBytes || size > kMaxProbeBytes) {
        return absl::InvalidArgumentError(absl::StrCat("bandwidth probe: size ", size,
                                                       " bytes out of [", kMinProbeBytes, ", ",
                                                       kMaxProbeBytes, "]"));
      }
      const int64_t numel = std::max<int64_t>(world, size / 4 / world * world);
      const torch::Tensor whole = torch::ones({numel}, floats);
      const torch::Tensor part = torch::ones({numel / world}, floats);
      for (const char* collective : kCollectives) {
        for (int i = 0; i < options.warmup; ++i) {
          RunOnce(comm, collective, whole, part);
        }
        Synchronize(device);
        double total_us = 0;
        for (int i = 0; i < options.iterations; ++i) {
          comm.Barrier("bandwidth probe");
          Synchronize(device);
          const auto start = std::chrono::steady_clock::now();
          RunOnce(comm, collective, whole, part);
          Synchronize(device);
          if (options.after_collective) options.after_collective(collective, numel * 4);
          total_us +=
              std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                  .count();
        }
        v1::BandwidthRow* row = report.add_rows();
        row->set_collective(collective);
        row->set_bytes(numel * 4);
        mine.push_back(total_us / options.iterations);
      }
    }
    // Every rank's times and host, to every rank.
    const torch::Tensor times = GatherAll(
        comm, torch::tensor(mine, torch::TensorOptions().dtype(torch::kFloat64)).to(device));
    torch::Tensor host = torch::zeros({kHostBytes}, torch::TensorOptions().dtype(torch::kUInt8));
    const std::string name = options.host.substr(0, kHostBytes - 1);
    std::copy(name.begin(), name.end(), reinterpret_cast<char*>(host.data_ptr<uint8_t>()));
    const torch::Tensor hosts = GatherAll(comm, host.to(device));
    const auto* t = times.data_ptr<double>();
    const auto* h = hosts.data_ptr<uint8_t>();
    std::set<std::string> nodes;
    for (int r = 0; r < world; ++r) {
      const char* start = reinterpret_cast<const char*>(h + r * kHostBytes);
      std::string peer(start, strnlen(start, kHostBytes));
      for (char& ch : peer) {  // bytes from a peer: printable ASCII only
        if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) > 0x7e)
          ch = '?';
      }
      report.add_rank_hosts(std::move(peer));
      nodes.insert(report.rank_hosts(r));
    }
    report.set_nodes(static_cast<int>(nodes.size()));
    const int rows = report.rows_size();
    for (int i = 0; i < rows; ++i) {
      v1::BandwidthRow* row = report.mutable_rows(i);
      double slowest = 0;
      for (int r = 0; r < world; ++r) {
        row->add_rank_time_us(t[r * rows + i]);
        slowest = std::max(slowest, t[r * rows + i]);
      }
      row->set_time_us(slowest);
      // bytes / seconds / 1e9 = bytes / microseconds / 1e3.
      const double algbw = slowest > 0 ? static_cast<double>(row->bytes()) / slowest / 1e3 : 0;
      row->set_algbw_gbps(algbw);
      row->set_busbw_gbps(algbw * BusBandwidthFactor(row->collective(), world));
    }
    return absl::OkStatus();
  }));
  return report;
}

void EmitBandwidthReport(const v1::BandwidthReport& report, EventSink* events) {
  v1::BandwidthReport fitted = report;
  // Rank times of the smallest sizes go first: the large sizes are where bandwidth shows.
  for (int i = 0; i < fitted.rows_size() && ReportJson(fitted).dump().size() > kMaxReportJsonBytes;
       ++i) {
    fitted.mutable_rows(i)->clear_rank_time_us();
  }
  std::cout << absl::StrFormat("bandwidth probe: %d ranks on %d nodes, %s, %s, %d iterations\n",
                               report.world_size(), report.nodes(), report.backend(),
                               report.dtype(), report.iterations());
  std::cout << absl::StrFormat("%-15s %12s %12s %12s %12s %s\n", "collective", "bytes", "time_us",
                               "algbw_GB/s", "busbw_GB/s", "slowest rank");
  for (const v1::BandwidthRow& row : report.rows()) {
    int slowest = 0;
    for (int r = 0; r < row.rank_time_us_size(); ++r) {
      if (row.rank_time_us(r) > row.rank_time_us(slowest)) slowest = r;
    }
    std::cout << absl::StrFormat("%-15s %12d %12.1f %12.3f %12.3f %d\n", row.collective(),
                                 row.bytes(), row.time_us(), row.algbw_gbps(), row.busbw_gbps(),
                                 slowest);
  }
  std::cout.flush();
  events->Emit("bandwidth", {{"report", ReportJson(fitted)}});
}

}  // namespace trainctl::trainer
