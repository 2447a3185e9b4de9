# gguf: ggml's type tables (IQ grids, sign and value tables, block sizes) are data the gguf
# package holds; gen_tables.py writes them into a header in the build tree, so no grid is typed
# by hand. Included by the top CMakeLists.txt with the _runtime target defined.
set(FTW_GGML_GEN "${CMAKE_CURRENT_LIST_DIR}/gen_tables.py")
set(FTW_GGML_TABLES_DIR "${CMAKE_CURRENT_BINARY_DIR}/generated/gguf")
set(FTW_GGML_TABLES "${FTW_GGML_TABLES_DIR}/ggml_tables.h")

# the tables follow the installed gguf: regenerate when its quants.py or constants.py change
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
    "import gguf.quants, gguf.constants; print(gguf.quants.__file__); print(gguf.constants.__file__, end='')"
  OUTPUT_VARIABLE FTW_GGUF_SOURCES RESULT_VARIABLE FTW_GGUF_FOUND ERROR_QUIET)
if(NOT FTW_GGUF_FOUND EQUAL 0)
  message(FATAL_ERROR "ftw: the build's Python (${Python_EXECUTABLE}) cannot import gguf; "
                      "the ggml type tables are generated from it (pip install gguf)")
endif()
string(REPLACE "\n" ";" FTW_GGUF_SOURCES "${FTW_GGUF_SOURCES}")

add_custom_command(
  OUTPUT "${FTW_GGML_TABLES}"
  COMMAND "${Python_EXECUTABLE}" "${FTW_GGML_GEN}" "${FTW_GGML_TABLES}"
  DEPENDS "${FTW_GGML_GEN}" ${FTW_GGUF_SOURCES}
  COMMENT "Generating ggml type tables from the gguf package"
  VERBATIM)
target_sources(_runtime PRIVATE "${FTW_GGML_TABLES}")
target_include_directories(_runtime PRIVATE "${FTW_GGML_TABLES_DIR}")
