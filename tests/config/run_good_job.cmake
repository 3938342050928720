# ctest helper: a ready job file validates (exit 0, optional `# validate: ARGS` line),
# and its resolved dump reloads to the very same dump. The datasets are not here
# (--no-data): validate's data check is tested in tests/train/test_classify.cpp.
file(STRINGS ${JOB} lines REGEX "^# validate: ")
set(args "")
if(lines)
  string(REGEX REPLACE "^# validate: " "" flags "${lines}")
  separate_arguments(args UNIX_COMMAND "${flags}")
endif()
get_filename_component(name ${JOB} NAME_WE)
file(MAKE_DIRECTORY ${WORK})
execute_process(COMMAND ${DTRAIN} validate ${JOB} ${args} --no-data
                RESULT_VARIABLE rc OUTPUT_VARIABLE first ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${JOB}: validate failed with ${rc}\n${err}")
endif()
file(WRITE ${WORK}/${name}.resolved.yaml "${first}")
execute_process(COMMAND ${DTRAIN} validate ${WORK}/${name}.resolved.yaml ${args} --no-data
                RESULT_VARIABLE rc OUTPUT_VARIABLE second ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${name}.resolved.yaml: reload failed with ${rc}\n${err}")
endif()
if(NOT first STREQUAL second)
  file(WRITE ${WORK}/${name}.reloaded.yaml "${second}")
  message(FATAL_ERROR "${name}: dump -> reload -> dump differs; compare ${WORK}/${name}.*.yaml")
endif()
