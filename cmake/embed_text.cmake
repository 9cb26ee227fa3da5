# Writes IN as a C++ string constant `kvs::default_config_toml` into OUT.
file(READ "${IN}" content)
set(delim "KVSTOML")
file(WRITE "${OUT}" "// Generated from config/default.toml; do not edit.\n#include <string_view>\nnamespace kvs {\nextern const std::string_view default_config_toml;\nconst std::string_view default_config_toml = R\"${delim}(${content})${delim}\";\n}\n")
