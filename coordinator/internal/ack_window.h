// AckWindow: one worker's sequenced messages between their arrival and their acknowledgement.
// Some are applied on the cluster's loop at once, others are stored later by the event ingester,
// so they finish out of order; an Ack covers a seq only once every message up to it has finished
// (the worker drops everything an Ack covers). Loop-thread only.
#ifndef TRAINCTL_COORDINATOR_INTERNAL_ACK_WINDOW_H_
#define TRAINCTL_COORDINATOR_INTERNAL_ACK_WINDOW_H_

#include <algorithm>
#include <cstdint>
#include <deque>

namespace trainctl::internal {

class AckWindow {
 public:
  // A message of `session` entered the window, finished already (`done`) or not yet.
  void Add(int64_t session, int64_t seq, bool done) { entries_.push_back({session, seq, done}); }

  // The message (session, seq) finished. False when the window has no such entry (it was dropped
  // by DropFrom or Clear since).
  bool MarkDone(int64_t session, int64_t seq) {
    for (Entry& e : entries_) {
      if (e.session == session && e.seq == seq) {
        e.done = true;
        return true;
      }
    }
    return false;
  }

  bool Contains(int64_t session, int64_t seq) const {
    return std::any_of(entries_.begin(), entries_.end(),
                       [&](const Entry& e) { return e.session == session && e.seq == seq; });
  }

  // Removes the finished messages at the front; returns the highest seq among them (what an Ack
  // may now cover), or 0 when none.
  int64_t PopDone() {
    int64_t through = 0;
    while (!entries_.empty() && entries_.front().done) {
      through = std::max(through, entries_.front().seq);
      entries_.pop_front();
    }
    return through;
  }

  // Nothing in the window waits to finish.
  bool AllDone() const {
    return std::all_of(entries_.begin(), entries_.end(), [](const Entry& e) { return e.done; });
  }

  // Forgets the messages with seq >= `seq`: the worker sends them again.
  void DropFrom(int64_t seq) {
    entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                  [seq](const Entry& e) { return e.seq >= seq; }),
                   entries_.end());
  }

  void Clear() { entries_.clear(); }

 private:
  struct Entry {
    int64_t session;
    int64_t seq;
    bool done;
  };
  std::deque<Entry> entries_;
};

}  // namespace trainctl::internal

#endif  // TRAINCTL_COORDINATOR_INTERNAL_ACK_WINDOW_H_
