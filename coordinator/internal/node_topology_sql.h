// The SQLite schema of node topology probes (SqliteJobStore's migration 5): one row per node, its
// latest probe as a serialized trainctl.v1.NodeTopology next to its probe time.
#ifndef TRAINCTL_COORDINATOR_INTERNAL_NODE_TOPOLOGY_SQL_H_
#define TRAINCTL_COORDINATOR_INTERNAL_NODE_TOPOLOGY_SQL_H_

namespace trainctl::internal {

inline constexpr char kNodeTopologyMigration[] = R"sql(
  CREATE TABLE node_topology (
    node TEXT PRIMARY KEY,
    probe_time_us INTEGER NOT NULL,
    topology BLOB NOT NULL
  );
)sql";

}  // namespace trainctl::internal

#endif  // TRAINCTL_COORDINATOR_INTERNAL_NODE_TOPOLOGY_SQL_H_
