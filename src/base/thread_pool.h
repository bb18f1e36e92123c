// ThreadPool: a fixed set of worker threads, created once, that run data-parallel jobs.
//
// run(n, fn) calls fn(task, thread) for every task in [0, n) and returns when all are done; the
// calling thread works too (thread id 0; workers are 1..size()-1). parallel_for splits a range
// into contiguous chunks. No thread is created or memory allocated per call. Workers spin briefly
// between jobs (decode issues hundreds of small jobs per token) and then sleep on a futex.
//
// Thread safety: run() may be called from any thread; calls from different threads are
// serialised. A run() from inside a task executes inline on that thread (no deadlock).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/function_ref.h"

namespace fathom {

class ThreadPool {
 public:
  // n_threads counts the caller: 1 means no workers (everything inline).
  static std::unique_ptr<ThreadPool> create(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  void run(int64_t n_tasks, FunctionRef<void(int64_t task, int thread)> fn);

  // As run(), with the tasks claimed from both ends of [0, n): half of the threads take them in
  // ascending order from 0, the other half in descending order from n - 1, until the two meet. A
  // caller that orders its tasks by the resource they are bound by (say compute-bound first,
  // memory-bound last) keeps the two kinds running side by side instead of the same kind on every
  // thread at once. Each task still runs exactly once. (Through run_from_both_ends_ahead: a runner
  // holds its next task while it runs one.)
  void run_from_both_ends(int64_t n_tasks, FunctionRef<void(int64_t task, int thread)> fn);

  // As run_from_both_ends, each runner claiming its next task before it runs the current one, so
  // fn knows what its thread runs next (to request those data ahead, say): `next` is that task, -1
  // after the runner's last, and `from_front` the end the runner claims from. A runner holds at most
  // one claimed task beside the running one. Each task still runs exactly once.
  struct BothEndsStep {
    int64_t task = 0;
    int64_t next = -1;
    bool from_front = true;
  };
  void run_from_both_ends_ahead(int64_t n_tasks, FunctionRef<void(const BothEndsStep& step, int thread)> fn);

  // Calls fn(begin, end, thread) over chunks of [0, n); chunks hold at least `grain` items and
  // there are at most about 4 per thread so uneven tasks still balance.
  void parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t begin, int64_t end, int thread)> fn);

 private:
  explicit ThreadPool(int n_threads);
  void worker_loop(int thread);
  void execute(uint32_t generation, int thread);

  const int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex run_mutex_;

  // The current job. `next_` packs (generation << 32 | next task) so a late worker can never
  // claim a task of a newer job with the old job's function.
  std::atomic<uint32_t> generation_{0};
  std::atomic<uint64_t> next_{0};
  std::atomic<int64_t> n_tasks_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<const FunctionRef<void(int64_t, int)>*> fn_{nullptr};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

namespace pool_testing {
// Called, when set, by run() (thread 0) just before it opens a job's tasks to the workers, and by a
// worker (thread > 0) that has seen a new job before it reads the job's function and size: a test
// widens both windows to check a lagging worker against the next job.
extern std::atomic<void (*)(int thread)> g_race_window;
}  // namespace pool_testing

// The process-wide pool used by kernels and the model. Sized on first use from
// set_default_pool_threads(), else FATHOM_THREADS, else the number of online CPUs.
ThreadPool& default_pool();
void set_default_pool_threads(int n_threads);
int default_thread_count();

}  // namespace fathom
