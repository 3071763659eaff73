// The SQLite schema of SqliteJobStore: numbered migrations (PRAGMA user_version).
#ifndef TRAINCTL_COORDINATOR_INTERNAL_SQLITE_SCHEMA_H_
#define TRAINCTL_COORDINATOR_INTERNAL_SQLITE_SCHEMA_H_

#include "coordinator/internal/node_topology_sql.h"

namespace trainctl::internal {

// Migration N (1-based) brings the schema from version N-1 to N. Never edit a released entry;
// append a new one. Jobs and events are stored as serialized protos (without the id/seq, which the
// rows' keys hold) next to the columns that queries filter on.
inline constexpr const char* kMigrations[] = {
    // 1: jobs and their events.
    R"sql(
      CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        request_id TEXT UNIQUE,
        state INTEGER NOT NULL,
        priority INTEGER NOT NULL,
        create_time_us INTEGER NOT NULL,
        update_time_us INTEGER NOT NULL,
        job BLOB NOT NULL
      );
      CREATE INDEX jobs_by_state ON jobs(state, id);
      CREATE TABLE job_events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL REFERENCES jobs(id),
        kind TEXT NOT NULL,
        event BLOB NOT NULL
      );
      CREATE INDEX job_events_by_job ON job_events(job_id, seq);
    )sql",
    // 2: rank log lines, kept as text so they can be read with the sqlite3 shell.
    R"sql(
      CREATE TABLE log_lines (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL REFERENCES jobs(id),
        rank INTEGER NOT NULL,
        stream TEXT NOT NULL,
        time_us INTEGER NOT NULL,
        text TEXT NOT NULL
      );
      CREATE INDEX log_lines_by_job ON log_lines(job_id, seq);
    )sql",
    // 3: pipeline stages, one row per stage of a job (Job.stages, kept out of the job's blob), and
    // the job's current stage. Jobs stored before have none; a pipeline among them gets its
    // stages when it is first placed.
    R"sql(
      CREATE TABLE job_stages (
        job_id INTEGER NOT NULL REFERENCES jobs(id),
        idx INTEGER NOT NULL,
        name TEXT NOT NULL,
        kind INTEGER NOT NULL,
        state INTEGER NOT NULL,
        stage BLOB NOT NULL,
        PRIMARY KEY (job_id, idx)
      );
      ALTER TABLE jobs ADD COLUMN current_stage INTEGER NOT NULL DEFAULT 0;
    )sql",
    // 4: the job's kind as a column, so that /metrics counts jobs by state and kind from an index
    // without reading a job. Jobs stored before get theirs from their blob (BackfillJobKinds, in
    // the same transaction).
    R"sql(
      ALTER TABLE jobs ADD COLUMN kind INTEGER NOT NULL DEFAULT 0;
      CREATE INDEX jobs_by_state_kind ON jobs(state, kind);
    )sql",
    // 5: each node's latest topology probe (sqlite_node_topology.cc).
    kNodeTopologyMigration,
};
inline constexpr int kJobKindColumnVersion = 4;
inline constexpr int kLatestVersion = sizeof(kMigrations) / sizeof(kMigrations[0]);

}  // namespace trainctl::internal

#endif  // TRAINCTL_COORDINATOR_INTERNAL_SQLITE_SCHEMA_H_
