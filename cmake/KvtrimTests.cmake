# kvtrim_discover_tests(<target> LABELS <tier>... [PREFIX <p>] [DISCOVERY_TIMEOUT <s>]
#                       [TIMEOUT <s>] [IO_SUITES <Suite>...])
#
# Registers every GoogleTest test of <target> with ctest (gtest_discover_tests: one ctest test,
# one process, per gtest test), labelled with its tier: `unit` (one module, in process),
# `integration` (a real kvtrimd, processes, the Python packages) or `gpu` (needs a device), so
# that `ctest -L unit` picks one tier (docs/architecture.md, "Tests"). The suites named in
# IO_SUITES write files, create shared-memory segments, bind sockets or start processes: their
# tests also get the label "io", which CI runs a second time in parallel and shuffled to catch
# tests that share a path or a port.
# Labels the tests a gtest_discover_tests(... TEST_LIST <list_var>) call finds with `labels` (a
# list), at ctest time: gtest_discover_tests' PROPERTIES splits a list value into words, so
# "unit;io" cannot pass through it.
function(kvtrim_label_discovered list_var labels)
  set(script ${CMAKE_CURRENT_BINARY_DIR}/${list_var}_labels.cmake)
  file(WRITE ${script}
    "foreach(test IN LISTS ${list_var})\n"
    "  set_tests_properties(\"\${test}\" PROPERTIES LABELS \"${labels}\")\n"
    "endforeach()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${script})
endfunction()

function(kvtrim_discover_tests target)
  cmake_parse_arguments(ARG "" "PREFIX;DISCOVERY_TIMEOUT;TIMEOUT" "LABELS;IO_SUITES" ${ARGN})
  if(NOT ARG_DISCOVERY_TIMEOUT)
    set(ARG_DISCOVERY_TIMEOUT 60)
  endif()
  if(NOT ARG_LABELS)
    message(FATAL_ERROR "kvtrim_discover_tests(${target}): name its tier: LABELS unit, "
                        "integration or gpu")
  endif()
  set(common TEST_PREFIX "${ARG_PREFIX}" DISCOVERY_TIMEOUT ${ARG_DISCOVERY_TIMEOUT})
  if(ARG_TIMEOUT)
    list(APPEND common PROPERTIES TIMEOUT ${ARG_TIMEOUT})
  endif()
  if(NOT ARG_IO_SUITES)
    gtest_discover_tests(${target} ${common} TEST_LIST ${target}_tests)
    kvtrim_label_discovered(${target}_tests "${ARG_LABELS}")
    return()
  endif()
  # "Suite.*" and "Instance/Suite.*" (value-parameterised), joined into one gtest filter.
  set(patterns)
  foreach(suite IN LISTS ARG_IO_SUITES)
    list(APPEND patterns "${suite}.*" "*/${suite}.*")
  endforeach()
  list(JOIN patterns ":" filter)
  gtest_discover_tests(${target} ${common} TEST_FILTER "${filter}" TEST_LIST ${target}_io_tests)
  kvtrim_label_discovered(${target}_io_tests "${ARG_LABELS};io")
  gtest_discover_tests(${target} ${common} TEST_FILTER "-${filter}" TEST_LIST ${target}_tests)
  kvtrim_label_discovered(${target}_tests "${ARG_LABELS}")
endfunction()
