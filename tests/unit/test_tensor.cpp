// Shapes, devices, tensors and views, and the caching allocator's statistics.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <fstream>

#include "core/allocator.h"
#include "core/tensor.h"

using namespace dtrain;

TEST_CASE("shape numel, indexing and printing") {
  Shape s{2, 3, 4};
  CHECK(s.rank() == 3);
  CHECK(s.numel() == 24);
  CHECK(s[-1] == 4);
  CHECK(s.str() == "[2, 3, 4]");
  CHECK(Shape{}.numel() == 1);
  CHECK_THROWS_AS(s[3], InternalError);
}

TEST_CASE("device parse") {
  CHECK(Device::parse("cpu") == Device::cpu());
  CHECK(Device::parse("cuda") == Device::cuda(0));
  CHECK(Device::parse("cuda:3") == Device::cuda(3));
  CHECK(Device::parse("cuda:3").str() == "cuda:3");
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:1x", "CPU", ""}) {
    CHECK_THROWS_WITH_AS(Device::parse(bad), doctest::Contains("unknown device"), Error);
  }
}

TEST_CASE("tensor views share storage and are bounds-checked") {
  Tensor t = Tensor::empty({4, 6}, DType::f32);
  for (int i = 0; i < 24; ++i) t.data<float>()[i] = static_cast<float>(i);
  Tensor row2 = t.view(12, {6});
  CHECK(row2.data<float>()[0] == 12.0f);
  row2.data<float>()[1] = -1.0f;
  CHECK(t.data<float>()[13] == -1.0f);
  CHECK(t.reshape({24}).numel() == 24);
  CHECK_THROWS_AS(t.view(20, {6}), InternalError);
  CHECK_THROWS_AS(t.reshape({5, 5}), InternalError);
  CHECK_THROWS_AS(t.data<double>(), InternalError);
  CHECK(t.str() == "f32[4, 6] cpu");
  Tensor cuda_view = Tensor::wrap(nullptr, {2}, DType::f32, Device::cuda(1));
  CHECK(cuda_view.device() == Device::cuda(1));
  CHECK_THROWS_AS(cuda_view.data<float>(), InternalError);  // no hidden device access
}

TEST_CASE("caching allocator: size classes, reuse and statistics") {
  CHECK(CachingAllocator::size_class(1) == 512);
  CHECK(CachingAllocator::size_class(513) == 1024);
  CHECK(CachingAllocator::size_class((1 << 20) + 1) == (1 << 20) + (1 << 18));
  CHECK(CachingAllocator::size_class(3 << 20) == 3 << 20);
  CHECK(CachingAllocator::size_class(size_t{80} << 20) == size_t{80} << 20);  // 2 MiB steps
  CHECK(CachingAllocator::size_class((size_t{80} << 20) + 1) == size_t{82} << 20);
  CHECK(CachingAllocator::size_class(size_t{350} * 1000 * 1000 * 1000) ==
        (size_t{350} * 1000 * 1000 * 1000 + (size_t{2} << 20) - 1) / (size_t{2} << 20) *
            (size_t{2} << 20));

  HostAllocator host;
  CachingAllocator cache(host);
  void* a = cache.allocate(1000);  // class 1024
  void* b = cache.allocate(5000);  // class 5120
  CHECK(cache.stats().current == 1024 + 5120);
  CHECK(cache.stats().reserved == 1024 + 5120);
  cache.deallocate(a, 1000);
  CHECK(cache.stats().current == 5120);
  CHECK(cache.stats().reserved == 1024 + 5120);  // cached, not returned
  void* c = cache.allocate(900);                 // same class: reused
  CHECK(c == a);
  CHECK(cache.stats().cache_hits == 1);
  CHECK(cache.stats().peak == 1024 + 5120);
  cache.deallocate(b, 5000);
  cache.deallocate(c, 900);
  CHECK(cache.stats().current == 0);
  cache.release_cached();
  CHECK(cache.stats().reserved == 0);
  CHECK(host.stats().current == 0);
}

TEST_CASE("held pages: only the held ranges are backed, zeros, counted while they live") {
  const auto page = static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  const int64_t per_page = page / 4;  // f32 elements
  // Two ranges on the same page count it once; a range across a boundary counts two.
  CHECK(held_pages_bytes({{0, 8}, {100, 200}}) == static_cast<size_t>(page));
  CHECK(held_pages_bytes({{static_cast<size_t>(page) - 4, static_cast<size_t>(page) + 4}}) ==
        2 * static_cast<size_t>(page));
  CHECK(held_pages_bytes({}) == 0);
  const size_t before = host_allocator().stats().current;
  {
    const std::vector<std::pair<int64_t, int64_t>> held = {{0, 10},
                                                           {5 * per_page, 7 * per_page + 1}};
    Tensor t = Tensor::held_pages({20 * per_page}, DType::f32, held);
    CHECK(t.numel() == 20 * per_page);
    CHECK(host_allocator().stats().current - before == 4 * static_cast<size_t>(page));
    CHECK(host_allocator().stats().peak >= host_allocator().stats().current);
    for (const auto& [a, b] : held) {
      for (int64_t i = a; i < b; ++i) CHECK(t.data<float>()[i] == 0.0f);
      t.data<float>()[b - 1] = 3.0f;
      CHECK(t.view(b - 1, {1}).data<float>()[0] == 3.0f);
    }
    CHECK_THROWS_AS(Tensor::held_pages({8}, DType::f32, {{4, 9}}), InternalError);
  }
  CHECK(host_allocator().stats().current == before);
}

namespace {
size_t resident_bytes() {  // this process's resident set
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}
}  // namespace

// Unheld::zeros (a frozen tensor's optimizer state): the rest reads 0 and commits
// nothing (reading 64 MiB of it leaves the resident set within a few MiB), the held
// range is ordinary memory, and a write outside it faults (in a child process).
TEST_CASE("held pages with readable zeros: reads commit nothing, a write faults") {
  const int64_t n = int64_t{16} << 20;  // 64 MiB of f32
  const size_t before = host_allocator().stats().current;
  Tensor t = Tensor::held_pages({n}, DType::f32, {{0, 1000}}, Unheld::zeros);
  CHECK(host_allocator().stats().current - before == held_pages_bytes({{0, 4000}}));
  t.data<float>()[999] = 5.0f;
  const size_t rss = resident_bytes();
  const float* v = t.data<float>();
  double sum = 0;
  for (int64_t i = 1000; i < n; ++i) sum += v[i];
  CHECK(sum == 0.0);
  CHECK(v[999] == 5.0f);
  const size_t grown = resident_bytes() - std::min(rss, resident_bytes());
  CHECK(grown < (size_t{8} << 20));
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    t.data<float>()[n / 2] = 1.0f;  // faults
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
}
