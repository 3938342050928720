# `dtrain validate` refuses (exit 2, naming the key) what `dtrain train` would refuse of
# the same job at start-up: layouts train cannot run yet, model.init_from with tensor
# parallelism on a fresh run; and it describes a ZeRO job's gradient traffic as ZeRO's.
# Each refusal is the trainer's own check (runtime::require_trainable and friends).
set(cfg ${SOURCE}/configs)
function(expect_refusal key)
  execute_process(COMMAND ${DTRAIN} validate ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "${key}")
    message(FATAL_ERROR "dtrain validate ${ARGN}: exit ${rc}, expected 2 naming ${key}\n${err}")
  endif()
endfunction()
expect_refusal("precision.master_weights: false with ZeRO"
  ${cfg}/gpt2-tiny-fortunes-zero2.yaml --world 2 --no-data --set precision.master_weights=false)
expect_refusal("parallel.zero_stage"
  ${cfg}/pipeline-resnet-fmnist.yaml --world 2 --no-data --set parallel.zero_stage=2)
expect_refusal("device: cuda(:0)? with parallel.pipeline > 1"
  ${cfg}/pipeline-resnet-fmnist.yaml --world 2 --no-data --set device=cuda)

string(RANDOM LENGTH 8 tag)
set(work "/tmp/dtrain-validate-refusals-${tag}")
file(WRITE ${work}/job.yaml "run: {output_dir: ${work}/run}
model: {arch: gpt2, layers: 2, hidden: 64, heads: 4, ffn: 128, seq_len: 32, vocab_size: 512,
        init_from: ${work}/no-such.safetensors}
data: {dataset: synthetic, global_batch: 4}
optimizer: {name: adamw, lr: 0.001}
train: {steps: 2}
parallel: {tensor: 2}
")
expect_refusal("model.init_from: not supported with parallel.tensor > 1"
  ${work}/job.yaml --world 2)
expect_refusal("model.init_from: not supported with parallel.tensor > 1"
  ${work}/job.yaml --world 2 --no-data)

# ZeRO-2's traffic is a reduction into the owners, not the all-reduce.
execute_process(COMMAND ${DTRAIN} validate ${cfg}/gpt2-tiny-fortunes-zero2.yaml --world 2 --no-data
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "reduced to their owners over" OR NOT out MATCHES
   "# ZeRO-2: optimizer state, fp32 masters, gradients sharded over 2 data ranks")
  message(FATAL_ERROR "dtrain validate of a ZeRO-2 job: exit ${rc}\n${out}${err}")
endif()
execute_process(COMMAND ${DTRAIN} estimate ${cfg}/gpt2-tiny-fortunes-zero2.yaml --world 2
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(REMOVE_RECURSE ${work})
if(NOT rc EQUAL 0 OR NOT out MATCHES "data [0-9.]+ [kMG]?B \\(ZeRO-2: every micro-batch's gradients")
  message(FATAL_ERROR "dtrain estimate of a ZeRO-2 job: exit ${rc}\n${out}${err}")
endif()
