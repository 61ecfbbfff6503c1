# Compiles SOURCE and passes only if compilation fails AND the first error line contains EXPECT.
execute_process(COMMAND ${COMPILER} -std=c++20 -fsyntax-only -I${INCLUDE_DIR} ${SOURCE}
                RESULT_VARIABLE result ERROR_VARIABLE errors OUTPUT_VARIABLE output)
if(result EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but it must not")
endif()
string(REGEX MATCH "error: [^\n]*" first_error "${errors}")
string(FIND "${first_error}" "${EXPECT}" found)
if(found EQUAL -1)
  message(FATAL_ERROR "first error of ${SOURCE} is\n  ${first_error}\nexpected it to contain\n  ${EXPECT}")
endif()
message(STATUS "first error: ${first_error}")
