// ThreadPool implementation: generation-tagged task claiming, spin-then-futex waits.
#include "base/thread_pool.h"

#include <algorithm>
#include <cstdlib>

#include "base/check.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define FATHOM_PAUSE() _mm_pause()
#else
#define FATHOM_PAUSE() std::this_thread::yield()
#endif

namespace fathom {
namespace {

thread_local bool t_inside_pool_task = false;
constexpr int kSpinIterations = 1 << 14;  // ~50-100 µs of pause before sleeping

}  // namespace

namespace pool_testing {
std::atomic<void (*)(int thread)> g_race_window{nullptr};
}

std::unique_ptr<ThreadPool> ThreadPool::create(int n_threads) {
  CHECK_MSG(n_threads >= 1 && n_threads <= 1024, "thread count {} out of range", n_threads);
  return std::unique_ptr<ThreadPool>(new ThreadPool(n_threads));
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads) {
  workers_.reserve(static_cast<size_t>(n_threads - 1));
  for (int t = 1; t < n_threads; ++t) workers_.emplace_back([this, t] { worker_loop(t); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::execute(uint32_t generation, int thread) {
  if (thread != 0) {
    if (auto* hook = pool_testing::g_race_window.load(std::memory_order_relaxed)) hook(thread);
  }
  const auto* fn = fn_.load(std::memory_order_acquire);
  const int64_t n = n_tasks_.load(std::memory_order_acquire);
  uint64_t cur = next_.load(std::memory_order_acquire);
  while (true) {
    if (static_cast<uint32_t>(cur >> 32) != generation) return;
    const int64_t task = static_cast<int64_t>(cur & 0xffffffffu);
    if (task >= n) return;
    if (!next_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel)) continue;
    t_inside_pool_task = true;
    (*fn)(task, thread);
    t_inside_pool_task = false;
    done_.fetch_add(1, std::memory_order_acq_rel);
    cur = next_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_loop(int thread) {
  uint32_t seen = 0;
  while (true) {
    uint32_t gen = generation_.load(std::memory_order_acquire);
    for (int i = 0; gen == seen && i < kSpinIterations; ++i) {
      FATHOM_PAUSE();
      gen = generation_.load(std::memory_order_acquire);
    }
    while (gen == seen) {
      sleepers_.fetch_add(1);
      gen = generation_.load();
      if (gen == seen) generation_.wait(seen);
      sleepers_.fetch_sub(1);
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load()) return;
    execute(gen, thread);
  }
}

void ThreadPool::run(int64_t n_tasks, FunctionRef<void(int64_t task, int thread)> fn) {
  if (n_tasks <= 0) return;
  CHECK_MSG(n_tasks < (int64_t{1} << 32), "too many tasks: {}", n_tasks);
  if (n_threads_ == 1 || n_tasks == 1 || t_inside_pool_task) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(t, 0);
    return;
  }
  std::lock_guard lock(run_mutex_);
  const uint32_t gen = generation_.load() + 1;
  // Close the previous job before replacing its function and size: a worker that saw it but reads
  // fn_ or n_tasks_ only now then reads (its loads are ordered after them) a next_ of this
  // generation with no task left, and returns. Without this it could claim a task of the new job
  // under the old tag: run twice, counted twice, and run() returning while a task of its job still
  // ran with the caller's function gone (a crash at a garbage address).
  next_.store((static_cast<uint64_t>(gen) << 32) | 0xffffffffu, std::memory_order_release);
  fn_.store(&fn, std::memory_order_release);
  n_tasks_.store(n_tasks, std::memory_order_release);
  done_.store(0, std::memory_order_release);
  if (auto* hook = pool_testing::g_race_window.load(std::memory_order_relaxed)) hook(0);
  next_.store(static_cast<uint64_t>(gen) << 32, std::memory_order_release);
  generation_.store(gen);
  if (sleepers_.load() > 0) generation_.notify_all();
  execute(gen, 0);
  for (int i = 0; done_.load(std::memory_order_acquire) < n_tasks; ++i) {
    if (i < kSpinIterations) {
      FATHOM_PAUSE();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::run_from_both_ends(int64_t n_tasks, FunctionRef<void(int64_t task, int thread)> fn) {
  run_from_both_ends_ahead(n_tasks, [&](const BothEndsStep& step, int thread) { fn(step.task, thread); });
}

void ThreadPool::run_from_both_ends_ahead(int64_t n_tasks,
                                          FunctionRef<void(const BothEndsStep& step, int thread)> fn) {
  if (n_tasks <= 0) return;
  CHECK_MSG(n_tasks < (int64_t{1} << 32), "too many tasks: {}", n_tasks);
  // (next task from the front) << 32 | (one past the next task from the back)
  std::atomic<uint64_t> ends{static_cast<uint64_t>(n_tasks)};
  run(std::min<int64_t>(n_threads_, n_tasks), [&](int64_t runner, int thread) {
    const bool from_front = runner % 2 == 0;
    const auto claim = [&]() -> int64_t {
      uint64_t e = ends.load(std::memory_order_relaxed);
      for (;;) {
        const int64_t front = static_cast<int64_t>(e >> 32), back = static_cast<int64_t>(e & 0xffffffffu);
        if (front >= back) return -1;
        if (ends.compare_exchange_weak(e, from_front ? e + (uint64_t{1} << 32) : e - 1,
                                       std::memory_order_relaxed)) {
          return from_front ? front : back - 1;
        }
      }
    };
    for (int64_t task = claim(); task >= 0;) {
      const int64_t next = claim();
      fn(BothEndsStep{task, next, from_front}, thread);
      task = next;
    }
  });
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              FunctionRef<void(int64_t begin, int64_t end, int thread)> fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int64_t chunks = std::min<int64_t>((n + grain - 1) / grain, int64_t{4} * n_threads_);
  if (chunks <= 1) {
    fn(0, n, 0);
    return;
  }
  const int64_t per = (n + chunks - 1) / chunks;
  chunks = (n + per - 1) / per;
  run(chunks, [&](int64_t c, int thread) { fn(c * per, std::min(n, (c + 1) * per), thread); });
}

namespace {
std::atomic<int> g_requested_threads{0};
}

int default_thread_count() {
  int n = g_requested_threads.load();
  if (n > 0) return n;
  if (const char* env = std::getenv("FATHOM_THREADS")) {
    n = std::atoi(env);
    if (n > 0) return std::min(n, 1024);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

void set_default_pool_threads(int n_threads) { g_requested_threads.store(n_threads); }

ThreadPool& default_pool() {
  static std::unique_ptr<ThreadPool> pool = ThreadPool::create(default_thread_count());
  return *pool;
}

}  // namespace fathom
