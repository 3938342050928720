# Usage errors exit 2 (not 1, not a crash; `estimate job.yaml`: no such file) with a
# `dtrain: error:` line, and
# --help lists the subcommands that exist (bench and report now among them).
foreach(args "frobnicate" "train;no-such-job.yaml" "train" "estimate;job.yaml" "bench;--suite;nothing" "bench;--suite;kernels;--only;no-such-figure" "report" "report;no-such-run" "validate" "--no-such-flag" "data" "data;tokenize" "ckpt" "ckpt;verify;no-such-checkpoint" "ckpt;export;no-such-checkpoint")
  execute_process(COMMAND ${DTRAIN} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 2)
    message(FATAL_ERROR "dtrain ${args}: exit ${rc}, expected 2\n${out}${err}")
  endif()
  # Every refusal is one of dtrain's errors, the command line's included.
  if(NOT err MATCHES "^dtrain: error: ")
    message(FATAL_ERROR "dtrain ${args}: stderr does not begin with 'dtrain: error: '\n${err}")
  endif()
endforeach()
# A range refused by the command line says the range, with the hint.
execute_process(COMMAND ${DTRAIN} train no-such-job.yaml --nproc 0 RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--nproc: Value 0 not in range 1 to" OR NOT err MATCHES "hint: see dtrain --help")
  message(FATAL_ERROR "dtrain train --nproc 0: exit ${rc}\n${err}")
endif()
execute_process(COMMAND ${DTRAIN} --help RESULT_VARIABLE rc OUTPUT_VARIABLE out)
if(NOT rc EQUAL 0 OR NOT out MATCHES "\n  bench " OR NOT out MATCHES "\n  report " OR NOT out MATCHES "\n  estimate " OR NOT out MATCHES "\n  ckpt ")
  message(FATAL_ERROR "dtrain --help: exit ${rc}, does not list every subcommand:\n${out}")
endif()
# Options are named as the user wrote them (--device, not the --set it becomes).
execute_process(COMMAND ${DTRAIN} estimate no-such-job.yaml --device tpu RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--device tpu: unknown device")
  message(FATAL_ERROR "dtrain estimate --device tpu: exit ${rc}\n${err}")
endif()
# A step-N directory without its manifest is named as a damaged sharded checkpoint.
string(RANDOM LENGTH 8 tag)
set(dir "/tmp/dtrain-exit-codes-${tag}/step-00000004")
file(MAKE_DIRECTORY ${dir})
file(TOUCH ${dir}/shard-00000.dtckpt)
execute_process(COMMAND ${DTRAIN} ckpt verify ${dir} RESULT_VARIABLE rc ERROR_VARIABLE err)
file(REMOVE_RECURSE "/tmp/dtrain-exit-codes-${tag}")
if(NOT rc EQUAL 2 OR NOT err MATCHES "a sharded checkpoint without its manifest.dtckpt")
  message(FATAL_ERROR "dtrain ckpt verify of a step directory without a manifest: exit ${rc}\n${err}")
endif()
# A corpus too small to give the validation split a token is written, with a warning:
# dtrain train refuses such a directory at start-up.
string(RANDOM LENGTH 8 tag)
set(work "/tmp/dtrain-exit-codes-${tag}")
file(WRITE ${work}/one.txt "one single document with a few words in it\n")
execute_process(COMMAND ${DTRAIN} data tokenize --input ${work}/one.txt --vocab-size 300 --out ${work}/tok
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
file(REMOVE_RECURSE ${work})
if(NOT rc EQUAL 0 OR NOT err MATCHES "warning: val.bin holds no tokens")
  message(FATAL_ERROR "dtrain data tokenize of one document: exit ${rc}\n${err}")
endif()
