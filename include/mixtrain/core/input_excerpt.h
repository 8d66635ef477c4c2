// How an error quotes what it read: control bytes escaped (an escape sequence in a CSV cell must not reach the
// user's terminal as one) and the excerpt capped (a 2 MB cell must not become a 2 MB error line).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace mixtrain {

// The first max_bytes bytes of text (cut at a UTF-8 character's start) with control bytes (C0, DEL and C1
// control characters) written as \n, \t, \r or \xNN; a longer text ends "... (N bytes)".
std::string input_excerpt(std::string_view text, size_t max_bytes = 80);

// The same escapes over a whole line (an error's message), capped at max_bytes (default 4 KiB): what the CLI
// prints for every error, so that no message, whatever it quotes, writes control bytes to the terminal.
std::string printable_line(std::string_view text, size_t max_bytes = 4096);

}  // namespace mixtrain
