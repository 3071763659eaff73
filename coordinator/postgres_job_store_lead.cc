// PostgresJobStore's lead among the coordinators of one database (postgres_job_store.h): the
// writer's advisory lock and the lease and epoch in table trainctl_leader.
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/internal/postgres_schema.h"
#include "coordinator/postgres_job_store.h"

namespace trainctl {

using pg::Params;
using pg::Result;

absl::Status PostgresJobStore::CheckLead(pg::Conn& conn) {
  // UNAVAILABLE, never a permanent error: what the callers write (a worker's reports, a placement)
  // is kept and written again, by whichever coordinator leads.
  const int64_t epoch = epoch_.load();
  if (epoch == 0) {
    return absl::UnavailableError(
        absl::StrCat(conn.name(), ": this coordinator does not lead the database"));
  }
  // FOR SHARE: a takeover (an UPDATE of the row) waits until this transaction has committed.
  ASSIGN_OR_RETURN(Result lead, conn.Query("SELECT epoch, expires_at > clock_timestamp() FROM "
                                           "trainctl_leader WHERE id = 1 FOR SHARE"));
  if (lead.rows() != 1 || lead.Int(0, 0) != epoch) {
    int64_t expected = epoch;
    epoch_.compare_exchange_strong(expected, 0);  // taken over: this store leads no more
    return absl::UnavailableError(TakenOver(conn, epoch));
  }
  if (lead.Int(0, 1) == 0) {
    return absl::UnavailableError(absl::StrCat(
        conn.name(), ": this coordinator's lease on the database ran out (not renewed in time)"));
  }
  return absl::OkStatus();
}

std::string PostgresJobStore::TakenOver(const pg::Conn& conn, int64_t epoch) {
  return absl::StrCat(conn.name(),
                      ": another trainctl-coordinator took the lead of this database (", "epoch ",
                      epoch, " is over)");
}

absl::Status PostgresJobStore::TryLead(const std::string& holder, absl::Duration lease) {
  if (leading()) return absl::OkStatus();
  absl::MutexLock lock(&writer_mu_);
  const std::string key =
      absl::StrCat(internal::kPostgresLockSpace, ", ", internal::kPostgresWriterLock);
  int64_t epoch = 0;
  bool locked = false;
  std::string refused;
  const absl::Status tried = InLeadTransaction([&](pg::Conn& conn) -> absl::Status {
    // A leader paused inside a transaction holds the row: wait a second, not for ever.
    RETURN_IF_ERROR(conn.Exec("SET LOCAL lock_timeout = '1s'"));
    ASSIGN_OR_RETURN(Result lead, conn.Query("SELECT holder, expires_at::text, expires_at < "
                                             "clock_timestamp() FROM trainctl_leader WHERE id = "
                                             "1 FOR UPDATE"));
    ASSIGN_OR_RETURN(Result got,
                     conn.Query(absl::StrCat("SELECT pg_try_advisory_lock(", key, ")")));
    locked = got.Int(0, 0) != 0;
    if (locked) {  // no live session holds the lock: the lead is free
      ASSIGN_OR_RETURN(Result taken,
                       conn.Query("UPDATE trainctl_leader SET epoch = epoch + 1, holder = $1, "
                                  "expires_at = clock_timestamp() + make_interval(secs => "
                                  "$2::float8 / 1000000) WHERE id = 1 RETURNING epoch",
                                  Params().Text(holder).Int(absl::ToInt64Microseconds(lease))));
      epoch = taken.Int(0, 0);
      return absl::OkStatus();
    }
    refused = absl::StrCat("another trainctl-coordinator leads this database (", lead.Bytes(0, 0),
                           ", its lease until ", lead.Bytes(0, 1), ")");
    if (lead.Int(0, 2) == 0) return absl::OkStatus();
    // The lease ran out while its holder's session lives on: a leader paused or cut off. Fence it
    // now (a new epoch, which its writes check) and end its session; the lock is free at the next
    // try, whoever reconnects first.
    absl::StrAppend(&refused, "; the lease ran out: its session is ended, and the lead taken next");
    RETURN_IF_ERROR(conn.Query("UPDATE trainctl_leader SET epoch = epoch + 1, holder = '', "
                               "expires_at = '-infinity' WHERE id = 1")
                        .status());
    return conn
        .Query(absl::StrCat("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = "
                            "'advisory' AND classid = ",
                            internal::kPostgresLockSpace,
                            " AND objid = ", internal::kPostgresWriterLock,
                            " AND objsubid = 2 AND granted AND pid <> pg_backend_pid()"))
        .status();
  });
  if (!tried.ok() || epoch == 0) {
    // A lock taken in a transaction that did not lead is let go: it would shut out the leader.
    if (locked) (void)writer_->Exec(absl::StrCat("SELECT pg_advisory_unlock(", key, ")"));
    if (!tried.ok()) return tried;
    return absl::FailedPreconditionError(absl::StrCat(writer_->name(), ": ", refused));
  }
  return BecomeLeader(epoch, lease, key);
}

absl::Status PostgresJobStore::BecomeLeader(int64_t epoch, absl::Duration lease,
                                            const std::string& key) {
  // A leader stalled inside a transaction (paused, cut off) holds the lead's row; the server ends
  // such a session after a lease, so that a standby can take over.
  const pg::SetupStatement idle = {
      absl::StrCat("SET idle_in_transaction_session_timeout = ", absl::ToInt64Milliseconds(lease)),
      ""};
  RETURN_IF_ERROR(writer_->Exec(idle.sql));
  if (pending_migration_ > 0) {
    RETURN_IF_ERROR(internal::MigratePostgres(*writer_, pending_migration_));
    pending_migration_ = 0;
  }
  lease_us_.store(absl::ToInt64Microseconds(lease));
  epoch_.store(epoch);
  if (relock_added_) return absl::OkStatus();
  relock_added_ = true;
  writer_->AddSetup(idle);
  // A reconnection takes the lock again, or is not used: another took the lead while this one was
  // cut off (its writes would be refused by the epoch anyway; this says why sooner).
  writer_->AddSetup({absl::StrCat("SELECT pg_try_advisory_lock(", key, ")"),
                     "another trainctl-coordinator took the lead of this database while this one "
                     "was cut off from it"});
  return absl::OkStatus();
}

absl::Status PostgresJobStore::RenewLead() {
  const int64_t epoch = epoch_.load();
  if (epoch == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(writer_->name(), ": this coordinator does not lead the database"));
  }
  absl::MutexLock lock(&writer_mu_);
  bool renewed = false;
  const absl::Status tried = InLeadTransaction([&](pg::Conn& conn) -> absl::Status {
    ASSIGN_OR_RETURN(Result rows, conn.Query("UPDATE trainctl_leader SET expires_at = "
                                             "clock_timestamp() + make_interval(secs => "
                                             "$1::float8 / 1000000) WHERE id = 1 AND epoch = $2 "
                                             "RETURNING 1",
                                             Params().Int(lease_us_.load()).Int(epoch)));
    renewed = rows.rows() > 0;
    return absl::OkStatus();
  });
  if (!tried.ok()) {
    // The writer cannot reach the lead (its reconnection finds the lock taken, or the server is
    // away): ask through the reader whether the epoch is still ours.
    absl::StatusOr<int64_t> current = Read([](pg::Conn& conn) -> absl::StatusOr<int64_t> {
      ASSIGN_OR_RETURN(Result rows, conn.Query("SELECT epoch FROM trainctl_leader WHERE id = 1"));
      return rows.Int(0, 0);
    });
    if (!current.ok() || *current == epoch) return tried;
  }
  if (renewed) return absl::OkStatus();
  int64_t expected = epoch;
  epoch_.compare_exchange_strong(expected, 0);
  return absl::FailedPreconditionError(TakenOver(*writer_, epoch));
}

}  // namespace trainctl
