// SPDX-License-Identifier: MIT
// The number of threads of this process, from /proc (Linux).
#pragma once

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

namespace alibi_test {

/// Threads of this process now, or -1 where /proc/self/status does not say (not Linux).
inline int live_threads() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  return -1;
}

/// live_threads() once it is `expected`, or after a second. Why wait: a joined thread has
/// left its function, but the kernel may count it a little longer.
inline int live_threads_settled(int expected) {
  int n = live_threads();
  for (int i = 0; i < 1000 && n != expected; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    n = live_threads();
  }
  return n;
}

}  // namespace alibi_test
