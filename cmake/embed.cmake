# Turns a text file into a C++ header with a raw string literal.
file(READ "${INPUT}" content)
file(WRITE "${OUTPUT}" "// Generated from ${INPUT}.\n#pragma once\nnamespace smockron {\ninline constexpr const char* ${NAME} = R\"smockron_embed(${content})smockron_embed\";\n}\n")
