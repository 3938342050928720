// graph::ExchangeSequence, the one walk of gradient compression's exchanges that the
// memory plan (overlap on) and dtrain estimate (overlap off) share: at each bucket's
// ready, the exchange in its second collective completes beside the one started last,
// which then advances, and the new one starts beside what stays in flight; finish()
// completes the rest.
#include <doctest/doctest.h>

#include "graph/memory_plan.h"

using dtrain::graph::BucketExchange;
using dtrain::graph::ExchangeSequence;

namespace {
// Two collectives each, then one (advance completes it); every figure distinct.
const BucketExchange kA{10, 4, 20, 3, 700};
const BucketExchange kB{100, 40, 200, 30, 70};
const BucketExchange kC{1000, 400, 2000, 0, 0};
}  // namespace

TEST_CASE("exchange sequence: each bucket's ready completes, advances and starts in order") {
  ExchangeSequence s;
  CHECK(s.held() == 0);
  CHECK(s.ready(kA) == 10);  // A starts
  CHECK(s.held() == 4);
  CHECK(s.ready(kB) == 103);  // A advances (20), B starts beside A's held2 (3 + 100)
  CHECK(s.held() == 43);
  // A completes beside B's held (700 + 40), B advances (200), C starts beside B's held2.
  CHECK(s.ready(kC) == 1030);
  CHECK(s.held() == 430);
  // B completes beside C's held (70 + 400), C advances and completes in one (2000).
  CHECK(s.finish() == 2000);
  CHECK(s.held() == 0);
}

TEST_CASE("exchange sequence: a second collective's completion can be the most") {
  ExchangeSequence one;
  CHECK(one.ready(kA) == 10);
  CHECK(one.finish() == 700);  // A advances (20), then completes alone (700)
  CHECK(one.held() == 0);

  ExchangeSequence two;
  CHECK(two.ready(kA) == 10);
  CHECK(two.ready(kB) == 103);
  CHECK(two.finish() == 740);  // A completes beside B's held (700 + 40)
  CHECK(two.held() == 0);

  ExchangeSequence none;
  CHECK(none.finish() == 0);
}
