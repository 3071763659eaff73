// SqliteJobStore's node topology probes: table node_topology (internal/node_topology_sql.h).
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/sqlite_job_store.h"
#include "google/protobuf/util/time_util.h"

namespace trainctl {

namespace v1 = trainctl::v1;

absl::Status SqliteJobStore::PutNodeTopology(const v1::NodeTopology& topology) {
  if (topology.node().empty()) {
    return absl::InvalidArgumentError("a node topology names no node");
  }
  const std::string blob = topology.SerializeAsString();
  const int64_t probe_time_us =
      google::protobuf::util::TimeUtil::TimestampToMicroseconds(topology.probe_time());
  return Write([&](sqlite::Db& db) -> absl::Status {
    ASSIGN_OR_RETURN(sqlite::CachedStatement st,
                     db.PrepareCached("INSERT INTO node_topology(node, probe_time_us, topology) "
                                      "VALUES(?, ?, ?) ON CONFLICT(node) DO UPDATE SET "
                                      "probe_time_us = excluded.probe_time_us, "
                                      "topology = excluded.topology"));
    return st->Bind(1, topology.node()).Bind(2, probe_time_us).BindBlob(3, blob).Run();
  });
}

absl::StatusOr<std::optional<v1::NodeTopology>> SqliteJobStore::GetNodeTopology(
    absl::string_view node) {
  absl::MutexLock lock(&read_mu_);
  ASSIGN_OR_RETURN(sqlite::CachedStatement st,
                   reader_db_->PrepareCached("SELECT topology FROM node_topology WHERE node = ?"));
  st->Bind(1, node);
  ASSIGN_OR_RETURN(bool row, st->Step());
  if (!row) return std::nullopt;
  v1::NodeTopology topology;
  if (!topology.ParseFromString(st->ColumnBlob(0))) {
    return absl::DataLossError(
        absl::StrCat(reader_db_->path(), ": stored topology of node ", node, " does not parse"));
  }
  return topology;
}

}  // namespace trainctl
