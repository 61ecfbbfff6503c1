# A NEW process resumes: `straight` trains 4 epochs; `first` trains 2 epochs (or stops after step
# STOP) and saves; `second`, another process, loads and trains to 4 epochs. The parameters and Adam
# moments must be byte-identical.
set(dir ${WORK}/resume_${NAME})
file(REMOVE_RECURSE ${dir})
file(MAKE_DIRECTORY ${dir})
function(run)
  execute_process(COMMAND ${PROBE} ${ARGN} RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "checkpoint_probe ${ARGN} failed: ${err}")
  endif()
endfunction()
run(straight ${dir}/straight.bin)
run(first ${dir}/state ${STOP})
run(second ${dir}/state ${dir}/resumed.bin)
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${dir}/straight.bin ${dir}/resumed.bin RESULT_VARIABLE same)
if(NOT same EQUAL 0)
  message(FATAL_ERROR "resumed parameters/optimizer state differ from the uninterrupted run")
endif()
