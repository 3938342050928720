// The ring's pure arithmetic: segments tile the buffer, and a simulated ring
// (every rank a vector, steps applied in lockstep) leaves the full sum on every
// rank, each segment summed along one fixed chain of ranks.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "dist/allreduce.h"

using namespace dtrain::dist;

TEST_CASE("ring segments tile the buffer, the first n % parts one longer") {
  for (size_t n = 0; n <= 23; ++n) {
    for (int parts = 1; parts <= 6; ++parts) {
      size_t next = 0;
      for (int i = 0; i < parts; ++i) {
        const Segment s = ring_segment(n, parts, i);
        CHECK(s.offset == next);
        CHECK(s.count == n / parts + (static_cast<size_t>(i) < n % parts ? 1 : 0));
        next += s.count;
      }
      CHECK(next == n);
    }
  }
}

TEST_CASE("ring piece count") {
  CHECK(ring_piece_count(0, 4) == 0);
  CHECK(ring_piece_count(1, 4) == 1);
  CHECK(ring_piece_count(8, 4) == 2);
  CHECK(ring_piece_count(9, 4) == 3);
}

// Each element holds the chain of ranks that summed it, as a string ("0+1+2").
using Chains = std::vector<std::vector<std::string>>;

void simulate_ring(Chains& bufs, int size, size_t n) {
  for (int step = 0; step + 1 < size; ++step) {
    Chains before = bufs;
    for (int r = 0; r < size; ++r) {
      const int left = (r + size - 1) % size;
      const Segment in = ring_segment(n, size, ring_reduce_scatter_step(r, size, step).recv);
      CHECK(ring_reduce_scatter_step(left, size, step).send ==
            ring_reduce_scatter_step(r, size, step).recv);
      for (size_t i = in.offset; i < in.offset + in.count; ++i) {
        bufs[r][i] = before[left][i] + "+" + bufs[r][i];
      }
    }
  }
  for (int step = 0; step + 1 < size; ++step) {
    Chains before = bufs;
    for (int r = 0; r < size; ++r) {
      const int left = (r + size - 1) % size;
      CHECK(ring_all_gather_step(left, size, step).send ==
            ring_all_gather_step(r, size, step).recv);
      const Segment in = ring_segment(n, size, ring_all_gather_step(r, size, step).recv);
      for (size_t i = in.offset; i < in.offset + in.count; ++i) bufs[r][i] = before[left][i];
    }
  }
}

TEST_CASE("a simulated ring gives every rank every rank's term, in one order per segment") {
  for (int size = 1; size <= 6; ++size) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{5}, size_t{13}}) {
      CAPTURE(size);
      CAPTURE(n);
      Chains bufs(size, std::vector<std::string>(n));
      for (int r = 0; r < size; ++r) {
        for (auto& e : bufs[r]) e = std::to_string(r);
      }
      simulate_ring(bufs, size, n);
      for (int r = 0; r < size; ++r) {
        CHECK(bufs[r] == bufs[0]);  // identical on every rank
      }
      for (int seg = 0; seg < size; ++seg) {
        const Segment s = ring_segment(n, size, seg);
        std::string chain = std::to_string(seg);  // starts at rank seg, ends at its owner
        for (int k = 1; k < size; ++k) chain.append("+").append(std::to_string((seg + k) % size));
        for (size_t i = s.offset; i < s.offset + s.count; ++i) CHECK(bufs[0][i] == chain);
        CHECK(ring_owned_segment((seg + size - 1) % size, size) == seg);
      }
    }
  }
}
