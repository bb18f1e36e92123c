// Waiting on peers with a deadline: 32-bit progress words in shared memory (advanced by their
// owner with release stores, futex-woken) and MPI requests (polled with MPI_Testsome). A wait
// spins for spin_us, then yields and blocks (futex for shared-memory words, short sleeps while
// MPI requests are pending), so oversubscribed ranks make progress. A timeout reports the first
// item still pending: which peer, and what was expected of it. Internal to ep/.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/function_ref.h"
#include "base/status.h"

namespace fathom::ep::internal {

// Owner side: value becomes visible after every earlier write; sleepers counts blocked waiters.
void publish_word(uint32_t* word, uint32_t value, uint32_t* sleepers);
uint32_t load_word(const uint32_t* word);
// A word nobody blocks on (peers only poll it): the release store alone, no futex wake.
void store_word(uint32_t* word, uint32_t value);
inline bool word_reached(uint32_t current, uint32_t target) {
  return static_cast<int32_t>(current - target) >= 0;
}

// Completes one request of a nonblocking collective (creation-time exchanges) within timeout_ms.
Status wait_collective(MPI_Request* request, int64_t timeout_ms, std::string_view what);

class Waiter {
 public:
  // Capacity of each list, fixed at creation: adding past it is a broken invariant.
  Waiter(int max_shm, int max_mpi);
  void reset(int64_t timeout_ms, int spin_us);
  void add_word(const uint32_t* word, uint32_t target, uint32_t* sleepers, int peer, const char* what);
  // Takes the request slot; wait() completes it (MPI_REQUEST_NULL afterwards).
  MPI_Request* add_request(int peer, const char* what);
  int pending_requests() const { return n_mpi_; }
  // describe(peer, what) builds the message of a timeout for the first pending item.
  Status wait(FunctionRef<std::string(int peer, const char* what, bool is_mpi)> describe);
  // After a failed wait: cancels receives and frees every request still pending.
  void abandon();
  double waited_s() const { return waited_s_; }

 private:
  struct Word {
    const uint32_t* word;
    uint32_t target;
    uint32_t* sleepers;
    int peer;
    const char* what;
  };
  bool words_done();
  void block_on_word(const Word& w, int64_t max_ns);
  std::vector<Word> words_;
  int n_words_ = 0;
  std::vector<MPI_Request> requests_;
  std::vector<int> req_peer_;
  std::vector<const char*> req_what_;
  std::vector<int> indices_;
  int n_mpi_ = 0;
  int64_t timeout_ms_ = 0;
  int spin_us_ = 0;
  double waited_s_ = 0;
};

}  // namespace fathom::ep::internal
