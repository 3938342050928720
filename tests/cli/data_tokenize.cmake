# `dtrain data tokenize` end to end on a small generated corpus (a fortune-style
# file, a plain file and a binary .dat that must be skipped): exit 0, the three
# files written, a summary printed; then a missing input exits 2 naming the path.
set(dir "${WORK}/data-tokenize")
file(REMOVE_RECURSE "${dir}")
file(MAKE_DIRECTORY "${dir}/text")
set(words "the cat sat on the mat and the dog ran to the park with a ball")
set(fortunes "")
foreach(i RANGE 1 200)
  string(APPEND fortunes "Fortune ${i}: ${words}, said the ${i}th sage.\n%\n")
endforeach()
file(WRITE "${dir}/text/quotes" "${fortunes}")
file(WRITE "${dir}/text/quotes.dat" "binary index")
file(WRITE "${dir}/text/notes.txt" "A plain document about ${words}.\n")

execute_process(COMMAND ${DTRAIN} data tokenize --input "${dir}/text" --vocab-size 300
                        --val-fraction 0.05 --out "${dir}/out"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "data tokenize: exit ${rc}\n${out}${err}")
endif()
foreach(f tokenizer.json train.bin val.bin)
  if(NOT EXISTS "${dir}/out/${f}")
    message(FATAL_ERROR "data tokenize did not write ${f}\n${out}")
  endif()
endforeach()
if(NOT out MATCHES "input: 2 files \\(1 skipped\\), 201 documents"
   OR NOT out MATCHES "tokenizer: trained, vocab 300 \\(38 merges\\)"
   OR NOT out MATCHES "bytes/token")
  message(FATAL_ERROR "data tokenize: unexpected summary:\n${out}")
endif()

execute_process(COMMAND ${DTRAIN} data tokenize --input "${dir}/no-such-dir" --vocab-size 300
                        --out "${dir}/out2"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "${dir}/no-such-dir: no such file or directory")
  message(FATAL_ERROR "missing input: exit ${rc}, expected 2 naming the path\n${out}${err}")
endif()
execute_process(COMMAND ${DTRAIN} data tokenize --input "${dir}/text" --out "${dir}/out3"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "needs --vocab-size")
  message(FATAL_ERROR "no --vocab-size: exit ${rc}, expected 2\n${out}${err}")
endif()
file(REMOVE_RECURSE "${dir}")
