// Waiter on shared-memory words: a blocked waiter is woken by a publish from another thread, and
// a word that never advances times out with a message naming the peer and what was awaited.
#include "ep/sync.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

namespace fathom::ep::internal {
namespace {

TEST(EpWaiter, APublishWakesABlockedWaiter) {
  alignas(64) uint32_t word = 0, sleepers = 0;
  Waiter w(4, 4);
  for (uint32_t target = 1; target <= 3; ++target) {
    w.reset(10000, 0);  // no spinning: go straight to the futex
    w.add_word(&word, target, &sleepers, 3, "its header");
    std::thread t([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      publish_word(&word, target, &sleepers);
    });
    Status s = w.wait([](int, const char*, bool) { return std::string("unexpected timeout"); });
    t.join();
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  EXPECT_EQ(sleepers, 0u);
}

TEST(EpWaiter, AWordThatNeverAdvancesTimesOutNamingThePeer) {
  alignas(64) uint32_t done = 5, stuck = 1, sleepers = 0;
  Waiter w(4, 4);
  w.reset(30, 10);
  w.add_word(&done, 5, &sleepers, 1, "its header");
  w.add_word(&stuck, 2, &sleepers, 2, "its rows");
  Status s = w.wait([](int peer, const char* what, bool mpi) {
    return "peer " + std::to_string(peer) + " " + what + (mpi ? " mpi" : " shm");
  });
  ASSERT_EQ(s.code(), StatusCode::kTimeout);
  EXPECT_EQ(s.message(), "peer 2 its rows shm");
  EXPECT_TRUE(word_reached(0x00000002u, 0xfffffffeu)) << "comparisons must survive wrap-around";
  EXPECT_FALSE(word_reached(0xfffffffeu, 0x00000002u));
}

}  // namespace
}  // namespace fathom::ep::internal
