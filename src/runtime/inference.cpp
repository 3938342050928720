// The weights and tokenizer of `dtrain generate` and `dtrain predict`
// (runtime/inference.h).
#include "runtime/inference.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kernels/memory.h"
#include "models/registry.h"
#include "runtime/safetensors.h"
#include "runtime/train_state.h"

namespace dtrain::runtime {
namespace fs = std::filesystem;

namespace {

constexpr const char* kWeightsHint =
    "pass --checkpoint: a checkpoint of this job's model (a step-N.dtckpt file, a step-N/ "
    "directory, a run directory) or a .safetensors file of its shape (dtrain ckpt export; "
    "Hugging Face's files for a GPT-2)";

// The model's attention heads, which no tensor's shape shows, against the job's.
void check_heads(const std::string& source, int64_t heads, int64_t job_heads) {
  if (heads > 0 && job_heads > 0 && heads != job_heads) {
    throw Error(fmt::format("{}: the model has {} attention heads, the job's model.heads is {}",
                            source, heads, job_heads),
                fmt::format("set model.heads: {} (--set model.heads={})", heads, heads));
  }
}

// Heads recorded beside a safetensors file: dtrain's export metadata, or the n_head (GPT-2)
// or num_attention_heads (BERT) of a Hugging Face config.json in the same directory; 0
// when neither says.
int64_t recorded_heads(const fs::path& file, const std::map<std::string, std::string>& meta) {
  if (auto it = meta.find("heads"); it != meta.end()) {
    int64_t heads = 0;
    const std::string& v = it->second;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), heads);
    if (ec != std::errc() || end != v.data() + v.size() || heads < 1) {
      throw Error(fmt::format("{}: metadata heads \"{}\" is not a head count", file.string(), v),
                  kWeightsHint);
    }
    return heads;
  }
  const fs::path config = file.parent_path() / "config.json";
  std::error_code ec;
  if (!fs::is_regular_file(config, ec)) return 0;
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(config), nullptr, false);
  for (const char* key : {"n_head", "num_attention_heads"}) {
    if (j.is_object() && j.contains(key) && j.at(key).is_number_integer())
      return j.at(key).get<int64_t>();
  }
  return 0;
}

ModelWeights from_safetensors(const fs::path& file, const Job& job, const graph::Graph& g,
                              int64_t job_heads, std::string_view command, std::string_view which) {
  InitWeights w;
  try {
    w = load_init_weights(file, job.model.arch, g.param_layout(), g.buffer_layout());
  } catch (const RunError&) {
    throw;
  } catch (const Error& e) {
    throw Error(e.message(), kWeightsHint);  // its own hint speaks of model.init_from
  }
  if (!w.fresh.empty()) {
    throw Error(fmt::format("{}: the file has no {} ({} tensor(s) of the model's task head "
                            "missing or shaped otherwise): it holds another head's weights",
                            file.string(), w.fresh.front(), w.fresh.size()),
                fmt::format("{} with the checkpoint of the run that trained this head (a "
                            "fine-tuning run's checkpoint, or its export)",
                            command));
  }
  check_heads(file.string(), recorded_heads(file, w.metadata), job_heads);
  // A file holds one set of weights; dtrain's export says which (metadata "weights").
  const auto kind = w.metadata.find("weights");
  const bool average = kind != w.metadata.end() && kind->second == "ema";
  if ((which == "ema" && !average) || (which == "model" && average)) {
    throw Error(fmt::format("--weights {}: {} holds one set of weights, {}", which, file.string(),
                            average ? "optimizer.ema's average (its export's metadata says so)"
                                    : "not an average of them"),
                "leave --weights out for a safetensors file, or pass the checkpoint it was "
                "exported from");
  }
  // dtrain's export records the checkpoint's step; another writer's file has none.
  int64_t step = -1;
  if (auto src = w.metadata.find("source"), at = w.metadata.find("step");
      src != w.metadata.end() && src->second == "dtrain" && at != w.metadata.end()) {
    const std::string& t = at->second;
    int64_t v = -1;
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (ec == std::errc() && end == t.data() + t.size() && v >= 0) step = v;
  }
  // dtrain's export of an image folder's model names its classes (a JSON list).
  std::vector<std::string> classes;
  if (auto names = w.metadata.find("classes"); names != w.metadata.end()) {
    const nlohmann::json list = nlohmann::json::parse(names->second, nullptr, false);
    classes = class_names_in(list, file.string());
  }
  return {w.params, w.buffers, file.string(), step, average, std::move(classes)};
}

ModelWeights from_checkpoint(const fs::path& path, const Job& job, const graph::Graph& g,
                             int64_t job_heads, std::string_view command, std::string_view which) {
  Checkpoint ck;
  try {
    ck = read_any_checkpoint(path);
  } catch (const RunError&) {
    throw;
  } catch (const Error& e) {
    throw Error(e.message(), kWeightsHint);  // its own hint speaks of resuming
  }
  const bool average = select_weights(ck, which) == "ema";
  if (ck.meta.contains("model")) {
    const nlohmann::json& m = ck.meta.at("model");
    if (!m.is_object() || (m.contains("heads") && !m.at("heads").is_number_integer())) {
      throw Error(fmt::format("{}: its model metadata {} is not dtrain's", path.string(), m.dump()),
                  kWeightsHint);
    }
    check_heads(path.string(), m.value("heads", int64_t{0}), job_heads);
  }
  const std::vector<NamedTensor> tensors = checkpoint_model_tensors(ck);
  std::map<std::string, const Tensor*> by_name;
  for (const NamedTensor& t : tensors) by_name[t.name] = &t.tensor;
  const std::string hint = fmt::format(
      "{} with the job file of the run that wrote it (its job.yaml has the model.* keys)", command);
  const graph::FlatStore layout(g.param_layout());
  ModelWeights w;
  w.params = Tensor::empty({layout.buffer_elems(DType::f32)}, DType::f32);
  std::fill_n(w.params.data<float>(), w.params.numel(), 0.0f);
  for (const graph::FlatEntry& e : layout.entries()) {
    auto it = by_name.find(e.name);
    if (it == by_name.end()) {
      throw Error(fmt::format("{}: the job's model ({}) has a tensor {} that the checkpoint "
                              "lacks: the run's model.* keys differ from the job's",
                              path.string(), job.model.arch, e.name),
                  hint);
    }
    const Tensor& t = *it->second;
    if (!(t.shape() == e.spec.shape)) {
      throw Error(
          fmt::format("{}: tensor {} is {} in the checkpoint, {} in the job's model ({})",
                      path.string(), e.name, t.shape().str(), e.spec.shape.str(), job.model.arch),
          hint);
    }
    std::copy_n(t.data<float>(), t.numel(), w.params.data<float>() + e.offset);
    by_name.erase(it);
  }
  const graph::FlatStore buffers(g.buffer_layout());
  if (buffers.buffer_elems(DType::f32) > 0) {
    w.buffers = Tensor::empty({buffers.buffer_elems(DType::f32)}, DType::f32);
    for (const graph::FlatEntry& e : buffers.entries()) {
      auto it = by_name.find(e.name);
      if (it == by_name.end() || !(it->second->shape() == e.spec.shape) ||
          it->second->dtype() != DType::f32) {
        throw Error(fmt::format("{}: the job's model ({}) has a buffer {} {} that the "
                                "checkpoint lacks or shapes otherwise",
                                path.string(), job.model.arch, e.name, e.spec.shape.str()),
                    hint);
      }
      std::copy_n(it->second->data<float>(), it->second->numel(),
                  w.buffers.data<float>() + e.offset);
      by_name.erase(it);
    }
  }
  if (!by_name.empty()) {
    throw Error(fmt::format("{}: the checkpoint's tensor {} is not part of the job's model ({})",
                            path.string(), by_name.begin()->first, job.model.arch),
                hint);
  }
  w.source = path.string();
  w.ema = average;
  w.step = ck.meta.value("step", int64_t{-1});
  if (ck.meta.contains("classes")) w.classes = class_names_in(ck.meta.at("classes"), w.source);
  return w;
}

}  // namespace

bool is_safetensors(const fs::path& path) {
  if (path.extension() == ".safetensors") return true;
  std::ifstream in(path, std::ios::binary);
  char head[9] = {};
  return in.read(head, sizeof(head)) && std::string_view(head, 8) != "DTRAINCK" && head[8] == '{';
}

ModelWeights read_model_weights(const Job& job, const std::string& weights, const graph::Graph& g,
                                int64_t heads, std::string_view command, std::string_view which) {
  if (weights == "best") {  // train.best's checkpoint, as best.json names it
    return from_checkpoint(resolve_resume("best", job.train.checkpoint.dir, "--checkpoint"), job, g,
                           heads, command, which);
  }
  if (!weights.empty() && weights != "latest") {
    std::error_code ec;
    if (fs::is_regular_file(weights, ec) && is_safetensors(weights))
      return from_safetensors(weights, job, g, heads, command, which);
    fs::path path;
    try {
      path = resolve_resume(weights, job.train.checkpoint.dir, "--checkpoint");
    } catch (const Error& e) {
      throw Error(e.message(), kWeightsHint);
    }
    return from_checkpoint(path, job, g, heads, command, which);
  }
  const fs::path newest = resolve_resume("latest", job.train.checkpoint.dir, "--checkpoint");
  if (!newest.empty()) return from_checkpoint(newest, job, g, heads, command, which);
  if (job.model.init_from) {
    try {
      return from_safetensors(*job.model.init_from, job, g, heads, command, which);
    } catch (const RunError&) {
      throw;
    } catch (const Error& e) {  // say why that file was read at all
      throw Error(fmt::format("no checkpoint in {} (train.checkpoint.dir) yet, so {} read "
                              "model.init_from: {}",
                              job.train.checkpoint.dir, command, e.message()),
                  "train the job first (dtrain train), or pass --checkpoint PATH");
    }
  }
  throw Error(fmt::format("no checkpoint in {} (train.checkpoint.dir) to {} from",
                          job.train.checkpoint.dir, command),
              "train the job first (dtrain train), or pass --checkpoint PATH: a checkpoint, a "
              "run directory or a .safetensors file");
}

namespace {

Tokenizer load_tokenizer(fs::path file, const char* hint) {
  std::error_code ec;
  if (fs::is_directory(file, ec)) {
    if (fs::is_regular_file(file / "tokenizer.json", ec)) {
      file /= "tokenizer.json";
    } else if (fs::is_regular_file(file / "vocab.json", ec) &&
               fs::is_regular_file(file / "merges.txt", ec)) {
      return Tokenizer::load_gpt2((file / "vocab.json").string(), (file / "merges.txt").string());
    } else {
      throw Error(fmt::format("{}: neither tokenizer.json nor vocab.json and merges.txt in it",
                              file.string()),
                  hint);
    }
  }
  if (!fs::is_regular_file(file, ec))
    throw Error(fmt::format("{}: no such tokenizer file", file.string()), hint);
  return Tokenizer::load(file.string());
}

bool same_vocabulary(const Tokenizer& a, const Tokenizer& b) {
  const TokenizerSpec &x = a.spec(), &y = b.spec();
  if (x.vocab_size != y.vocab_size || x.byte_ids != y.byte_ids || x.special_ids != y.special_ids ||
      x.merges.size() != y.merges.size())
    return false;
  for (size_t i = 0; i < x.merges.size(); ++i) {
    const Merge &m = x.merges[i], &n = y.merges[i];
    if (m.left != n.left || m.right != n.right || m.result != n.result) return false;
  }
  return true;
}

}  // namespace

Tokenizer read_model_tokenizer(const Job& job, const std::string& tokenizer,
                               std::string_view command) {
  constexpr const char* kHint =
      "pass --tokenizer: the tokenizer.json `dtrain data tokenize` wrote, or a directory with "
      "GPT-2's vocab.json and merges.txt";
  const bool tokens = job.data.path && job.data.dataset == DatasetName::tokens;
  if (tokenizer.empty()) {
    if (!tokens) {
      throw Error(fmt::format("{} needs the tokenizer of the model's training text, and the job's "
                              "data has none (data.dataset is not tokens)",
                              command),
                  kHint);
    }
    return load_tokenizer(fs::path(*job.data.path) / "tokenizer.json", kHint);
  }
  Tokenizer tok = load_tokenizer(tokenizer, kHint);
  // The training data's tokenizer, where it is still there, is the one the model knows.
  std::error_code ec;
  const fs::path trained = tokens ? fs::path(*job.data.path) / "tokenizer.json" : fs::path();
  if (tokens && fs::is_regular_file(trained, ec) &&
      !same_vocabulary(tok, Tokenizer::load(trained))) {
    throw Error(fmt::format("--tokenizer {}: not the vocabulary of the model's training data "
                            "({}; its tokens and special ids differ)",
                            tokenizer, trained.string()),
                "leave --tokenizer out to use the training data's, or point data.path at the "
                "data the model was trained on");
  }
  return tok;
}

SoftmaxRow softmax_row(std::span<const float> logits, std::string_view hint) {
  SoftmaxRow r{-std::numeric_limits<double>::infinity(), 0.0};
  for (float x : logits) {
    if (!std::isfinite(x)) {
      throw RunError("the model's logits are not finite (a checkpoint of a run that diverged?)",
                     std::string(hint));
    }
    r.top = std::max(r.top, static_cast<double>(x));
  }
  for (float x : logits) r.sum += std::exp(static_cast<double>(x) - r.top);
  return r;
}

int64_t padded_length(int64_t positions, int64_t context) {
  int64_t n = kShortestForward;
  while (n < positions) n *= 2;
  return std::min(n, context);
}

std::unique_ptr<InferenceGraph> make_inference_graph(const Job& job, const ModelOptions& options,
                                                     int64_t batch, const Tensor& weights,
                                                     bool labels, const Tensor& buffers) {
  auto f = std::make_unique<InferenceGraph>();
  f->copy_inputs = !job.device.is_cpu();
  f->batch = batch;
  f->length = options.seq_len.value_or(0);
  f->model = models::build_model(options, batch);  // fp32: the default DTypePolicy
  f->ex =
      std::make_unique<graph::Executor>(f->model.graph, job.device, graph::GradBuffer::external);
  f->ex->keep(f->model.logits, graph::Mode::eval);
  const int loss_node = f->model.graph.value(f->model.loss).producer;
  DTRAIN_CHECK(loss_node == static_cast<int>(f->model.graph.nodes().size()) - 1,
               "inference: the loss is node {} of {}, not the last", loss_node,
               f->model.graph.nodes().size());
  f->ex->set_range(0, loss_node);
  Tensor live = f->ex->params().flat(DType::f32);
  DTRAIN_CHECK(live.defined() && live.numel() == weights.numel(),
               "inference: {} weights for a layout of {}", weights.numel(),
               live.defined() ? live.numel() : 0);
  kernels::copy(weights, live);
  if (buffers.defined()) {  // batch norm's running statistics: what eval mode reads
    Tensor mine = f->ex->buffers().flat(DType::f32);
    DTRAIN_CHECK(mine.defined() && mine.numel() == buffers.numel(),
                 "inference: {} buffer elements for a layout of {}", buffers.numel(),
                 mine.defined() ? mine.numel() : 0);
    kernels::copy(buffers, mine);
  }
  Allocator* alloc = &kernels::device_allocator(job.device);
  const auto on_device = [&](const Tensor& host) {
    return job.device.is_cpu() ? host : Tensor::empty(host.shape(), host.dtype(), alloc);
  };
  const graph::TensorSpec& in = f->model.graph.value(f->model.input).spec;
  f->input_host = Tensor::empty(in.shape, in.dtype);
  f->input = on_device(f->input_host);
  if (labels) {
    f->labels_host = Tensor::empty({batch, f->length}, DType::i32);
    f->labels = on_device(f->labels_host);
  }
  return f;
}

const Tensor& InferenceGraph::forward() {
  if (copy_inputs) kernels::copy(input_host, input);
  ex->set_input(model.input, input);
  if (labels.defined()) {
    if (copy_inputs) kernels::copy(labels_host, labels);
    ex->set_input(model.labels, labels);
  }
  ex->forward(graph::Mode::eval);
  return ex->value(model.logits);
}

}  // namespace dtrain::runtime
