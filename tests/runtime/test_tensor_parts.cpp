// The moves between a tensor rank's split layout and the one-rank model's whole layout
// that a tensor-parallel checkpoint save makes (runtime/tensor_parallel.h), on layouts
// built by hand: a ZeRO shard of a rank's local layout adds exactly its parts of a whole
// range, and the replicated entries' digests of shards cut anywhere add up to the whole
// entry's and change with any bit.
#include <doctest/doctest.h>

#include <cstring>

#include "runtime/tensor_parallel.h"

using namespace dtrain;
using dtrain::graph::FlatEntry;
using dtrain::graph::FlatStore;

namespace {

Tensor zeros(const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::f32);
  std::memset(t.raw(), 0, t.nbytes());
  return t;
}

// "w" [rows, 3] cut by rows over `size` ranks (a vocabulary: 5 rows, 3 + 2), then "b"
// [3] replicated and "v" [2, 4] cut by columns; size 1: the whole model.
std::vector<FlatEntry> layout(int rank, int size) {
  const auto rows = graph::share_of(5, rank, size);
  const auto cols = graph::share_of(4, rank, size);
  graph::ParamSpec w{.name = "w", .shape = Shape{rows.second, 3}};
  graph::ParamSpec b{.name = "b", .shape = Shape{3}};
  graph::ParamSpec v{.name = "v", .shape = Shape{2, cols.second}};
  if (size > 1) {
    w.split = {.dim = 0, .total = 5, .begin = rows.first};
    v.split = {.dim = 1, .total = 4, .begin = cols.first};
  }
  return FlatStore({{"w", w, 0, 0}, {"b", b, 1, 0}, {"v", v, 2, 0}}).entries();
}

// A layout's flat f32 buffer holding, at every element, its whole index's value
// (1000 x entry + whole index + 1); padding 0.
Tensor values(const std::vector<FlatEntry>& l) {
  Tensor t = zeros(Shape{FlatStore(l).buffer_elems(DType::f32)});
  for (size_t i = 0; i < l.size(); ++i) {
    for (int64_t j = 0; j < l[i].spec.shape.numel(); ++j) {
      t.data<float>()[l[i].offset + j] =
          static_cast<float>(1000 * i + graph::whole_index(l[i].spec, j) + 1);
    }
  }
  return t;
}

}  // namespace

TEST_CASE("ZeRO shards of two tensor ranks' local layouts add up to any range of the whole") {
  const std::vector<FlatEntry> whole = layout(0, 1);
  const Tensor expect = values(whole);
  const int64_t total = expect.numel();
  for (const auto& [lo, hi] : std::vector<std::pair<int64_t, int64_t>>{{0, total}, {7, 23}}) {
    CAPTURE(lo);
    Tensor out = zeros(Shape{hi - lo});
    for (int tp = 0; tp < 2; ++tp) {
      const std::vector<FlatEntry> local = layout(tp, 2);
      const Tensor mine = values(local);
      const int64_t n = mine.numel();
      // Three data ranks' shards of it, cut where they fall (mid-entry too).
      for (const auto& [a, b] : std::vector<std::pair<int64_t, int64_t>>{
               {0, n / 3}, {n / 3, 2 * n / 3}, {2 * n / 3, n}}) {
        runtime::add_local_to_whole_range(mine.view(a, Shape{b - a}), local, whole, tp == 0, lo,
                                          out, a);
      }
    }
    for (int64_t x = lo; x < hi; ++x) {
      CAPTURE(x);
      CHECK(out.data<float>()[x - lo] == expect.data<float>()[x]);
    }
  }
}

TEST_CASE("replicated entries' digests: shards add to the whole, and one bit changes them") {
  const std::vector<FlatEntry> l = layout(1, 2);
  const Tensor t = values(l);
  const int64_t n = t.numel();
  const std::vector<int64_t> whole = runtime::replicated_digests({t}, l, 0);
  REQUIRE(whole.size() == 1);  // "b" alone is replicated
  CHECK(whole[0] != 0);
  for (const int64_t cut : {int64_t{1}, l[1].offset + 1, l[1].offset + 2, n - 1}) {
    CAPTURE(cut);
    const auto a = runtime::replicated_digests({t.view(0, Shape{cut})}, l, 0);
    const auto b = runtime::replicated_digests({t.view(cut, Shape{n - cut})}, l, cut);
    CHECK(a[0] + b[0] == whole[0]);
  }
  Tensor changed = values(l);
  uint32_t bits = 0;
  std::memcpy(&bits, changed.data<float>() + l[1].offset + 1, 4);
  bits ^= 1;  // the last bit of b[1]
  std::memcpy(changed.data<float>() + l[1].offset + 1, &bits, 4);
  CHECK(runtime::replicated_digests({changed}, l, 0)[0] != whole[0]);
  // Swapping two elements moves values between indices: a different digest too.
  Tensor swapped = values(l);
  std::swap(swapped.data<float>()[l[1].offset], swapped.data<float>()[l[1].offset + 2]);
  CHECK(runtime::replicated_digests({swapped}, l, 0)[0] != whole[0]);
}
