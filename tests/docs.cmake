# The README's configuration tables are checked against both programs' --help.
add_test(NAME readme_config
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/readme_check.sh $<TARGET_FILE:chunkgate>
          $<TARGET_FILE:chunkgate-worker> ${PROJECT_SOURCE_DIR}/README.md)
