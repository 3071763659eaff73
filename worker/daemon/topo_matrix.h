// The `nvidia-smi topo -m` matrix, parsed: which devices (GPUs, NICs) the node has, how each pair
// is linked (X, NV#, PIX, PXB, PHB, NODE, SYS), each GPU's CPU and NUMA affinity, and the NIC
// legend.
//
// The layouts differ across driver versions, and all are read:
// - older drivers name NICs in the header by device ("mlx5_0"), newer ones "NIC0" plus a
//   "NIC Legend:" block ("  NIC0: mlx5_0") after the matrix;
// - the trailing columns are "CPU Affinity" alone, or with "NUMA Affinity", and "GPU NUMA ID";
// - cells are tab-separated (" X " for self) or space-padded; "SOC" is an old name of SYS.
// Lines starting with '#' before the header are skipped (a fixture's source line). A row missing
// for a NIC is allowed (an output cut short: every GPU-NIC cell is also in the GPU rows); a row
// missing for a GPU is not. Pure: no I/O.
#ifndef TRAINCTL_WORKER_DAEMON_TOPO_MATRIX_H_
#define TRAINCTL_WORKER_DAEMON_TOPO_MATRIX_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainctl/v1/diagnostics.pb.h"

namespace trainctl::worker {

// One matrix cell: its LinkType, and for NV# the number of links in `*nvlinks` (else 0).
// INVALID_ARGUMENT for anything else ("NV0", "FOO").
absl::StatusOr<trainctl::v1::LinkType> ParseLinkCell(absl::string_view cell, int* nvlinks);

// Parses the output into a NodeTopology holding only `devices` (in the header's order) and `links`
// (one per pair a < b whose cell is known). INVALID_ARGUMENT naming the line (1-based, of `text`)
// and, for a cell, its column and the two devices: no header, an unknown or repeated row, too few
// or too many cells, a bad cell, "X" off the diagonal, cells that disagree across the diagonal, a
// GPU without a row, a legend entry for a NIC the matrix does not have.
absl::StatusOr<trainctl::v1::NodeTopology> ParseTopoMatrix(absl::string_view text);

}  // namespace trainctl::worker

#endif  // TRAINCTL_WORKER_DAEMON_TOPO_MATRIX_H_
