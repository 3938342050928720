// What `dtrain train` refuses before any work (runtime/trainer.h, train_session.h):
// the device CUDA reports, a layout's combinations not built yet, model.init_from with
// tensor parallelism, train.best's evaluations, and a job whose estimated peak exceeds
// the rank's memory. `dtrain validate` calls the job-only ones too.
#include "dist/launcher.h"
#include "runtime/train_session.h"

namespace dtrain::runtime {

namespace {

[[noreturn]] void unsupported(const std::string& key, const std::string& value,
                              const std::string& hint) {
  throw Error(fmt::format("{}: {} is not supported by `dtrain train` yet", key, value), hint);
}

// Everything the job file can switch on that this trainer cannot honour fails
// here, before any work, rather than being silently ignored.
// device: cuda is checked against what CUDA itself reports, so a machine
// without a GPU or driver gets CUDA's reason rather than a later failure.
void require_device(const Device& device) {
  if (!device.is_cuda()) return;
  const kernels::CudaInfo cuda = kernels::query_cuda();
  const std::string hint =
      "run on a machine with an NVIDIA GPU and its driver (`dtrain info` lists what CUDA "
      "finds), or set device: cpu";
  if (!cuda.built) {
    throw Error(fmt::format("device: {}: no CUDA device available (this dtrain was built "
                            "without CUDA)",
                            device.str()),
                "rebuild with -DDTRAIN_CUDA=ON (needs nvcc), or set device: cpu");
  }
  if (!cuda.available) {
    throw Error(fmt::format("device: {}: no CUDA device available ({})", device.str(), cuda.reason),
                hint);
  }
  if (device.index >= static_cast<int>(cuda.devices.size())) {
    throw Error(fmt::format("device: {}: this machine has {} CUDA device(s), cuda:0 to cuda:{}",
                            device.str(), cuda.devices.size(), cuda.devices.size() - 1),
                "pick one of the devices `dtrain info` lists");
  }
}

}  // namespace

void require_supported(const Job& job, int world) {
  require_device(job.device);
  const ParallelOptions& p = job.parallel;
  if (p.data * p.pipeline * p.tensor != world) {
    unsupported("parallel",
                fmt::format("data {} x tensor {} x pipeline {} on {} rank(s)", p.data, p.tensor,
                            p.pipeline, world),
                "the degrees multiply to the number of ranks started (--nproc, srun -n, "
                "mpirun -np): set them to, or start their product");
  }
  require_trainable(job);
}

void require_trainable(const Job& job) {
  const ParallelOptions& p = job.parallel;
  if (p.tensor > 1) {  // what the first tensor-parallel step leaves for later, refused by name
    const auto later = [&](const std::string& key, const std::string& value) {
      throw Error(fmt::format("{}: {} with parallel.tensor > 1 is not supported yet", key, value),
                  "tensor-parallel ranks run with any zero_stage (0-1 in a pipeline), on the "
                  "CPU; drop the key or parallel.tensor");
    };
    if (job.device.is_cuda()) later("device", job.device.str());
  }
  if (p.pipeline > 1) {  // what the first pipeline step leaves for later, refused by name
    const auto later = [&](const std::string& key, const std::string& value) {
      throw Error(fmt::format("{}: {} with parallel.pipeline > 1 is not supported yet", key, value),
                  "pipeline stages run with zero_stage 0 or 1 and fp32 masters, on the CPU; "
                  "drop the key or parallel.pipeline");
    };
    if (p.zero_stage > 1) later("parallel.zero_stage", std::to_string(p.zero_stage));
    // A stage steps its own span of the fp32 layout (its masters), as ZeRO steps a shard.
    if (compute_dtype(job.precision.dtype) != DType::f32 && !job.precision.master_weights)
      later("precision.master_weights", "false");
    if (job.device.is_cuda()) later("device", job.device.str());
  }
  if (p.zero_stage >= 1) {
    if (compute_dtype(job.precision.dtype) != DType::f32 && !job.precision.master_weights) {
      unsupported("precision.master_weights", "false with ZeRO (ZeRO shards the fp32 masters)",
                  "keep precision.master_weights: true with parallel.zero_stage, or run "
                  "without ZeRO (zero_stage: 0) to train on half weights alone");
    }
  }
  if (!models::find_model(job.model.arch)) {
    unsupported("model.arch", job.model.arch + " (no graph builder for it yet)",
                "pick an architecture dtrain builds (resnet18/34/50/101/152, vit-*, bert-*, gpt2, "
                "gpt2-*)");
  }
}

void require_init_from_supported(const Job& job) {
  if (job.model.init_from && job.parallel.tensor > 1) {
    throw Error("model.init_from: not supported with parallel.tensor > 1 yet",
                "start from the file on one rank (or with data or pipeline parallelism) for "
                "one step, then resume that checkpoint with parallel.tensor (--resume; the "
                "resumed run does not read init_from): checkpoints move between layouts");
  }
}

void require_best_evaluations(const Job& job, int64_t total_steps) {
  const TrainOptions& t = job.train;
  if (t.best.metric != BestMetric::none && t.eval_every && *t.eval_every >= total_steps) {
    throw Error(
        fmt::format("train.eval_every: {} evaluates after the last step ({}): "
                    "train.best.metric {} would compare the final evaluation alone",
                    *t.eval_every, total_steps, to_string(t.best.metric)),
        fmt::format("set train.eval_every below {}, or train.best.metric: none", total_steps));
  }
}

// A job whose estimated peak exceeds what this rank has fails now, with the estimate
// and the smallest change that fits, instead of with an allocator error mid-step.
MemoryEstimate require_fits(const Job& job) {
  const MemoryEstimate e = estimate_memory(job);
  const size_t capacity = rank_capacity(job, dist::launcher_local_size().value_or(1));
  if (capacity == 0 || e.peak_bytes <= capacity) return e;  // 0: unknown, nothing to compare
  const FitAdvice fit = fit_memory(job, capacity);
  throw RunError(fmt::format("this job needs an estimated {:.2f} GB per rank and {} has {:.2f} "
                             "GB:\n{}{}",
                             static_cast<double>(e.peak_bytes) / 1e9,
                             job.device.is_cuda() ? job.device.str() : "this machine (available)",
                             static_cast<double>(capacity) / 1e9, format_estimate(e),
                             format_fit(fit, capacity)),
                 fit.fits ? "apply the --set overrides above (the global batch stays the same)"
                          : "choose a smaller model or batch");
}

}  // namespace dtrain::runtime
