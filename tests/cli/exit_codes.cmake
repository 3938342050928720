# Usage errors exit 2 (not 1, not a crash; `estimate job.yaml`: no such file), and
# subcommands that do not work yet (bench) are absent rather than placeholders.
foreach(args "frobnicate" "train;no-such-job.yaml" "train" "estimate;job.yaml" "bench" "validate" "--no-such-flag" "data" "data;tokenize" "ckpt" "ckpt;verify;no-such-checkpoint" "ckpt;export;no-such-checkpoint")
  execute_process(COMMAND ${DTRAIN} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 2)
    message(FATAL_ERROR "dtrain ${args}: exit ${rc}, expected 2\n${out}${err}")
  endif()
endforeach()
execute_process(COMMAND ${DTRAIN} --help RESULT_VARIABLE rc OUTPUT_VARIABLE out)
if(NOT rc EQUAL 0 OR out MATCHES "\n  bench " OR NOT out MATCHES "\n  estimate " OR NOT out MATCHES "\n  ckpt ")
  message(FATAL_ERROR "dtrain --help: exit ${rc}, lists a subcommand that does not exist yet:\n${out}")
endif()
