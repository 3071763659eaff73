#include "coordinator/internal/postgres_schema.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace trainctl::internal {

absl::StatusOr<int> PostgresSchemaVersion(pg::Conn& conn) {
  ASSIGN_OR_RETURN(pg::Result table, conn.Query("SELECT to_regclass('trainctl_schema') IS NULL"));
  if (table.Bytes(0, 0) == std::string(1, '\1')) return 0;  // binary boolean: true
  ASSIGN_OR_RETURN(pg::Result rows, conn.Query("SELECT version FROM trainctl_schema"));
  return rows.rows() == 0 ? 0 : static_cast<int>(rows.Int(0, 0));
}

absl::Status CheckPostgresSchema(pg::Conn& conn) {
  ASSIGN_OR_RETURN(int current, PostgresSchemaVersion(conn));
  if (current <= kPostgresLatestVersion) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      conn.name(), ": schema version ", current, " is newer than this coordinator supports (",
      kPostgresLatestVersion, "); run a newer trainctl-coordinator"));
}

absl::Status MigratePostgres(pg::Conn& conn, int target) {
  const std::string lock = absl::StrCat("SELECT pg_advisory_xact_lock(", kPostgresLockSpace, ", ",
                                        kPostgresMigrationLock, ")");
  for (int v = 1; v <= target; ++v) {
    RETURN_IF_ERROR(conn.Exec("BEGIN"));
    // Read under the lock: another coordinator may have migrated while this one waited.
    absl::Status s = conn.Exec(lock);
    absl::StatusOr<int> current = s.ok() ? PostgresSchemaVersion(conn) : s;
    if (current.ok() && *current > kPostgresLatestVersion) {
      (void)conn.Exec("ROLLBACK");
      return absl::FailedPreconditionError(absl::StrCat(
          conn.name(), ": schema version ", *current, " is newer than this coordinator supports (",
          kPostgresLatestVersion, "); run a newer trainctl-coordinator"));
    }
    if (current.ok() && *current >= v) {
      RETURN_IF_ERROR(conn.Exec("ROLLBACK"));
      continue;
    }
    s = current.status();
    if (s.ok() && v == 1) {
      s = conn.Exec(
          "CREATE TABLE trainctl_schema (version INTEGER NOT NULL); "
          "INSERT INTO trainctl_schema VALUES (0)");
    }
    if (s.ok()) s = conn.Exec(kPostgresMigrations[v - 1]);
    if (s.ok()) s = conn.Exec(absl::StrCat("UPDATE trainctl_schema SET version = ", v));
    if (s.ok()) s = conn.Exec("COMMIT");
    if (!s.ok()) {
      (void)conn.Exec("ROLLBACK");
      return absl::Status(s.code(), absl::StrCat("schema migration ", v, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace trainctl::internal
