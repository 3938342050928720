// Cluster files for `dtrain plan`: read strictly, like job files (every mistake an
// Error naming file:line:col and the key).
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "config/config.h"
#include "core/error.h"

using namespace dtrain;

namespace {

// ctest runs each test case as its own process, two at once: each writes its own file.
std::string write(const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("dtrain-test-cluster-" + std::to_string(::getpid()) + ".yaml"))
                               .string();
  std::ofstream(path) << text;
  return path;
}

const char* kGood =
    "nodes: 4\n"
    "devices_per_node: 8\n"
    "device: {memory_gb: 80, peak_tflops: 989, efficiency: 0.4}\n"
    "links:\n"
    "  intra_node: {bandwidth_gb_s: 450, latency_us: 3}\n"
    "  inter_node: {bandwidth_gb_s: 50, latency_us: 10}\n";

std::string error_of(const std::string& text) {
  try {
    config::load_cluster_file(write(text));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a cluster file: nodes, devices, their memory and peak, the links") {
  const runtime::Cluster c = config::load_cluster_file(write(kGood));
  CHECK(c.world() == 32);
  CHECK(c.memory_bytes == doctest::Approx(80e9));
  CHECK(c.peak_flops == doctest::Approx(989e12));
  CHECK(c.efficiency == doctest::Approx(0.4));
  CHECK(c.memory_bandwidth == doctest::Approx(900e9));  // the default
  CHECK(c.intra.bandwidth == doctest::Approx(450e9));
  CHECK(c.inter.latency == doctest::Approx(10e-6));
  // One node: its links stop at intra_node (nothing crosses nodes); more need inter_node.
  const std::string one =
      "nodes: 1\ndevices_per_node: 8\ndevice: {memory_gb: 80, peak_tflops: 989}\n"
      "links: {intra_node: {bandwidth_gb_s: 450, latency_us: 3}}\n";
  CHECK(config::load_cluster_file(write(one)).world() == 8);
  std::string two = one;
  two.replace(two.find("nodes: 1"), 8, "nodes: 2");
  CHECK(error_of(two).find("links.inter_node: is required") != std::string::npos);
}

TEST_CASE("a cluster file's mistakes name the key") {
  std::string s = kGood;
  CHECK(error_of(s + "gpus: 3\n").find("unknown key \"gpus\"") != std::string::npos);
  CHECK(error_of("nodes: 1\n").find("devices_per_node: is required") != std::string::npos);
  std::string bad = kGood;
  bad.replace(bad.find("bandwidth_gb_s: 50"), 18, "bandwidth_gb_s: -5");
  CHECK(error_of(bad).find("links.inter_node.bandwidth_gb_s") != std::string::npos);
  bad = kGood;
  bad.replace(bad.find("efficiency: 0.4"), 15, "efficiency: 1.5");
  CHECK(error_of(bad).find("device.efficiency") != std::string::npos);
  bad = kGood;
  bad.replace(bad.find("nodes: 4"), 8, "nodes: two");
  CHECK(error_of(bad).find("nodes") != std::string::npos);
  // A missing file is named as the cluster file it should be, not as a job file.
  std::string missing;
  try {
    config::load_cluster_file("/nonexistent/cluster.yaml");
  } catch (const Error& e) {
    missing = e.what();
  }
  CHECK(missing.find("/nonexistent/cluster.yaml: cluster file not found") != std::string::npos);
}
