# The README's configuration tables are checked against both programs' --help.
add_test(NAME readme_config
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/readme_check.sh $<TARGET_FILE:chunkgate>
          $<TARGET_FILE:chunkgate-worker> ${PROJECT_SOURCE_DIR}/README.md)
# The layout rules of DESIGN §12: no include cycle between modules, no two top-level folders
# including each other, the gateway's side never including the kernels or the worker.
add_test(NAME layout_check COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/layout_check.py ${PROJECT_SOURCE_DIR})
# scripts/demo.sh on its own stack from this build (the trained model where it is committed).
add_test(NAME demo_check COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/demo_check.sh ${CMAKE_BINARY_DIR})
set_tests_properties(demo_check PROPERTIES ENVIRONMENT OMP_WAIT_POLICY=passive TIMEOUT 300)
