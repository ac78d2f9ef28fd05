# kvtrim_discover_tests(<target> [PREFIX <p>] [DISCOVERY_TIMEOUT <s>] [TIMEOUT <s>]
#                       [LABELS <label>...] [IO_SUITES <Suite>...])
#
# Registers every GoogleTest test of <target> with ctest (gtest_discover_tests: one ctest test,
# one process, per gtest test). The suites named in IO_SUITES write files, create shared-memory
# segments, bind sockets or start processes: their tests also get the label "io", which CI runs
# a second time in parallel and shuffled to catch tests that share a path or a port.
function(kvtrim_discover_tests target)
  cmake_parse_arguments(ARG "" "PREFIX;DISCOVERY_TIMEOUT;TIMEOUT" "LABELS;IO_SUITES" ${ARGN})
  if(NOT ARG_DISCOVERY_TIMEOUT)
    set(ARG_DISCOVERY_TIMEOUT 60)
  endif()
  set(common TEST_PREFIX "${ARG_PREFIX}" DISCOVERY_TIMEOUT ${ARG_DISCOVERY_TIMEOUT})
  set(properties)
  if(ARG_TIMEOUT)
    list(APPEND properties TIMEOUT ${ARG_TIMEOUT})
  endif()
  if(NOT ARG_IO_SUITES)
    if(ARG_LABELS)
      list(APPEND properties LABELS ${ARG_LABELS})
    endif()
    if(properties)
      gtest_discover_tests(${target} ${common} PROPERTIES ${properties})
    else()
      gtest_discover_tests(${target} ${common})
    endif()
    return()
  endif()
  # "Suite.*" and "Instance/Suite.*" (value-parameterised), joined into one gtest filter.
  set(patterns)
  foreach(suite IN LISTS ARG_IO_SUITES)
    list(APPEND patterns "${suite}.*" "*/${suite}.*")
  endforeach()
  list(JOIN patterns ":" filter)
  gtest_discover_tests(${target} ${common} TEST_FILTER "${filter}"
    PROPERTIES ${properties} LABELS io)
  if(properties)
    gtest_discover_tests(${target} ${common} TEST_FILTER "-${filter}" PROPERTIES ${properties})
  else()
    gtest_discover_tests(${target} ${common} TEST_FILTER "-${filter}")
  endif()
endfunction()
