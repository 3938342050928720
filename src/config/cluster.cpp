// Cluster files for `dtrain plan` (runtime/plan.h): nodes, devices and links, as
// strictly as a job file: an unknown or missing key, a wrong type or a value out of
// range is an Error naming file:line:col and the key.
//
//   nodes: 4
//   devices_per_node: 4
//   device: {memory_gb: 16, peak_tflops: 125, efficiency: 0.4,   # efficiency: 0.5 unset
//            memory_bandwidth_gb_s: 900, launch_us: 5}          # optional, these defaults
//   links:
//     intra_node: {bandwidth_gb_s: 150, latency_us: 5}
//     inter_node: {bandwidth_gb_s: 12.5, latency_us: 10}
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <vector>

#include "config/config.h"
#include "config/fields.h"
#include "config/tree.h"
#include "core/error.h"

namespace dtrain::config {

namespace {

// The entries of map `node` at `path`, each key checked against `keys` (all required
// unless listed in `optional`).
std::map<std::string, const ConfigNode*> read_map(const ConfigNode& node, const std::string& path,
                                                  const std::vector<std::string>& keys,
                                                  const std::vector<std::string>& optional = {}) {
  if (node.kind != ConfigNode::Kind::map) {
    fail(node.loc, path.empty() ? "the cluster" : path,
         fmt::format("expected a mapping of {}, got {}", fmt::join(keys, ", "), describe(node)));
  }
  std::map<std::string, const ConfigNode*> out;
  for (const Entry& e : node.entries) {
    const std::string key = path.empty() ? e.key : path + "." + e.key;
    if (std::find(keys.begin(), keys.end(), e.key) == keys.end()) {
      throw Error(fmt::format("{}: unknown key \"{}\"", e.key_loc.str(), key),
                  fmt::format("{} takes: {}", path.empty() ? "a cluster file" : path,
                              fmt::join(keys, ", ")));
    }
    out[e.key] = &e.value;
  }
  for (const std::string& k : keys) {
    if (out.count(k) || std::find(optional.begin(), optional.end(), k) != optional.end()) continue;
    fail(node.loc, path.empty() ? k : path + "." + k, "is required",
         "a cluster file says nodes, devices_per_node, device {memory_gb, peak_tflops} and "
         "links {intra_node, inter_node} each {bandwidth_gb_s, latency_us}");
  }
  return out;
}

runtime::Link read_link(const ConfigNode& node, const std::string& path) {
  const auto m = read_map(node, path, {"bandwidth_gb_s", "latency_us"});
  runtime::Link l;
  l.bandwidth = read_real(*m.at("bandwidth_gb_s"), path + ".bandwidth_gb_s", {}) * 1e9;
  l.latency = read_real(*m.at("latency_us"), path + ".latency_us", {0, 1e9, false, true}) * 1e-6;
  return l;
}

}  // namespace

runtime::Cluster load_cluster_file(const std::string& path) {
  const std::string text = read_job_file(path, "cluster file");
  const ConfigNode root = parse_yaml(text, path);
  const auto top = read_map(root, "", {"nodes", "devices_per_node", "device", "links"});
  runtime::Cluster c;
  c.nodes = static_cast<int>(read_int(*top.at("nodes"), "nodes", {1, 1 << 20}));
  c.devices_per_node =
      static_cast<int>(read_int(*top.at("devices_per_node"), "devices_per_node", {1, 1 << 16}));
  const auto dev =
      read_map(*top.at("device"), "device",
               {"memory_gb", "peak_tflops", "efficiency", "memory_bandwidth_gb_s", "launch_us"},
               {"efficiency", "memory_bandwidth_gb_s", "launch_us"});
  c.memory_bytes = read_real(*dev.at("memory_gb"), "device.memory_gb", {}) * 1e9;
  c.peak_flops = read_real(*dev.at("peak_tflops"), "device.peak_tflops", {}) * 1e12;
  if (dev.count("efficiency")) {
    c.efficiency = read_real(*dev.at("efficiency"), "device.efficiency", {0, 1, true, false});
  }
  if (dev.count("memory_bandwidth_gb_s")) {
    c.memory_bandwidth =
        read_real(*dev.at("memory_bandwidth_gb_s"), "device.memory_bandwidth_gb_s", {}) * 1e9;
  }
  if (dev.count("launch_us")) {
    c.launch = read_real(*dev.at("launch_us"), "device.launch_us", {0, 1e6, false, true}) * 1e-6;
  }
  // One node: nothing crosses nodes, so inter_node may be left out.
  const auto links =
      read_map(*top.at("links"), "links", {"intra_node", "inter_node"},
               c.nodes == 1 ? std::vector<std::string>{"inter_node"} : std::vector<std::string>{});
  c.intra = read_link(*links.at("intra_node"), "links.intra_node");
  c.inter =
      links.count("inter_node") ? read_link(*links.at("inter_node"), "links.inter_node") : c.intra;
  return c;
}

}  // namespace dtrain::config
