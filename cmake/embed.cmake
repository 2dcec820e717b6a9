# Turns a text file into a C++ header with a raw string literal. With
# -DSPLICE=FILE (and -DSPLICE2=FILE), the text each FILE holds replaces the
# marker /*@<FILE's name>@*/ in it first (what the status pages share).
file(READ "${INPUT}" content)
foreach(splice IN ITEMS ${SPLICE} ${SPLICE2})
  file(READ "${splice}" spliced)
  get_filename_component(marker "${splice}" NAME)
  string(FIND "${content}" "/*@${marker}@*/" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${INPUT} has no /*@${marker}@*/ marker")
  endif()
  string(REPLACE "/*@${marker}@*/" "${spliced}" content "${content}")
endforeach()
file(WRITE "${OUTPUT}" "// Generated from ${INPUT}.\n#pragma once\nnamespace smockron {\ninline constexpr const char* ${NAME} = R\"smockron_embed(${content})smockron_embed\";\n}\n")
