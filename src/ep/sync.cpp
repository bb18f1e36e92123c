// Waiter: spin, then yield, then block, until every shared-memory word and MPI request is done
// or the deadline passes. Futex waits use the shared (non-private) form so they work across the
// processes that map the arena.
#include "ep/sync.h"

#include <immintrin.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <climits>

#include "base/check.h"
#include "base/timer.h"

namespace fathom::ep::internal {
namespace {

std::atomic_ref<uint32_t> atomic_word(const uint32_t* w) {
  return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(w));
}

void futex_wait(const uint32_t* word, uint32_t expected, int64_t ns) {
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, const_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void sleep_ns(int64_t ns) {
  timespec ts{0, static_cast<long>(ns)};
  nanosleep(&ts, nullptr);
}

}  // namespace

void publish_word(uint32_t* word, uint32_t value, uint32_t* sleepers) {
  atomic_word(word).store(value, std::memory_order_seq_cst);
  if (atomic_word(sleepers).load(std::memory_order_seq_cst) != 0) futex_wake_all(word);
}

void store_word(uint32_t* word, uint32_t value) {
  atomic_word(word).store(value, std::memory_order_release);
}

uint32_t load_word(const uint32_t* word) {
  return atomic_word(word).load(std::memory_order_acquire);
}

Waiter::Waiter(int max_shm, int max_mpi)
    : words_(static_cast<size_t>(max_shm)),
      requests_(static_cast<size_t>(max_mpi), MPI_REQUEST_NULL),
      req_peer_(static_cast<size_t>(max_mpi)),
      req_what_(static_cast<size_t>(max_mpi)),
      indices_(static_cast<size_t>(max_mpi)) {}

void Waiter::reset(int64_t timeout_ms, int spin_us) {
  CHECK_MSG(n_mpi_ == 0, "a wait with {} MPI requests was never completed", n_mpi_);
  n_words_ = 0;
  timeout_ms_ = timeout_ms;
  spin_us_ = spin_us;
}

void Waiter::add_word(const uint32_t* word, uint32_t target, uint32_t* sleepers, int peer, const char* what) {
  CHECK_MSG(n_words_ < static_cast<int>(words_.size()), "waiter word capacity {} exceeded", words_.size());
  words_[static_cast<size_t>(n_words_++)] = {word, target, sleepers, peer, what};
}

MPI_Request* Waiter::add_request(int peer, const char* what) {
  CHECK_MSG(n_mpi_ < static_cast<int>(requests_.size()), "waiter request capacity {} exceeded",
            requests_.size());
  const size_t i = static_cast<size_t>(n_mpi_++);
  req_peer_[i] = peer;
  req_what_[i] = what;
  requests_[i] = MPI_REQUEST_NULL;
  return &requests_[i];
}

bool Waiter::words_done() {
  while (n_words_ > 0) {
    const Word& w = words_[static_cast<size_t>(n_words_ - 1)];
    if (!word_reached(load_word(w.word), w.target)) return false;
    --n_words_;  // done: drop it (order does not matter)
  }
  return true;
}

void Waiter::block_on_word(const Word& w, int64_t max_ns) {
  std::atomic_ref<uint32_t> sleepers(*w.sleepers);
  sleepers.fetch_add(1, std::memory_order_seq_cst);
  const uint32_t seen = atomic_word(w.word).load(std::memory_order_seq_cst);
  if (!word_reached(seen, w.target)) futex_wait(w.word, seen, max_ns);
  sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

Status Waiter::wait(FunctionRef<std::string(int, const char*, bool)> describe) {
  const uint64_t start = now_ns();
  const uint64_t deadline = start + static_cast<uint64_t>(timeout_ms_) * 1000000;
  const uint64_t spin_end = start + static_cast<uint64_t>(spin_us_) * 1000;
  while (true) {
    if (n_mpi_ > 0) {
      int done = 0;
      MPI_Testsome(n_mpi_, requests_.data(), &done, indices_.data(), MPI_STATUSES_IGNORE);
      if (done == MPI_UNDEFINED || done == n_mpi_) {
        n_mpi_ = 0;
      } else if (done > 0) {  // compact the still-pending requests
        int k = 0;
        for (int i = 0; i < n_mpi_; ++i) {
          if (requests_[static_cast<size_t>(i)] == MPI_REQUEST_NULL) continue;
          requests_[static_cast<size_t>(k)] = requests_[static_cast<size_t>(i)];
          req_peer_[static_cast<size_t>(k)] = req_peer_[static_cast<size_t>(i)];
          req_what_[static_cast<size_t>(k)] = req_what_[static_cast<size_t>(i)];
          ++k;
        }
        n_mpi_ = k;
      }
    }
    const bool words = words_done();
    if (words && n_mpi_ == 0) break;
    const uint64_t t = now_ns();
    if (t >= deadline) {
      waited_s_ = static_cast<double>(t - start) * 1e-9;
      if (!words) {
        const Word& w = words_[static_cast<size_t>(n_words_ - 1)];
        return timeout_error("{}", describe(w.peer, w.what, false));
      }
      return timeout_error("{}", describe(req_peer_[0], req_what_[0], true));
    }
    if (t < spin_end) {
      for (int i = 0; i < 64; ++i) _mm_pause();
    } else if (n_mpi_ > 0) {
      if (t - start < 2000000)
        sched_yield();
      else
        sleep_ns(20000);
    } else {
      block_on_word(words_[static_cast<size_t>(n_words_ - 1)], std::min<int64_t>(deadline - t, 5000000));
    }
  }
  waited_s_ = static_cast<double>(now_ns() - start) * 1e-9;
  return {};
}

Status wait_collective(MPI_Request* request, int64_t timeout_ms, std::string_view what) {
  const uint64_t start = now_ns(), deadline = start + static_cast<uint64_t>(timeout_ms) * 1000000;
  while (true) {
    int done = 0;
    MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (done) return {};
    const uint64_t t = now_ns();
    if (t >= deadline) {
      MPI_Request_free(request);
      return timeout_error(
          "ep: {} did not complete within {} ms: not every rank of the communicator took part", what,
          timeout_ms);
    }
    if (t - start < 2000000)
      sched_yield();
    else
      sleep_ns(20000);
  }
}

void Waiter::abandon() {
  for (int i = 0; i < n_mpi_; ++i) {
    MPI_Request& r = requests_[static_cast<size_t>(i)];
    if (r == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&r);
    MPI_Request_free(&r);
  }
  n_mpi_ = 0;
  n_words_ = 0;
}

}  // namespace fathom::ep::internal
