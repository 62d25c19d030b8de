// The page troupe serve answers GET / with (serve/page.cpp).
#pragma once
#include <string>

namespace troupe {

const std::string& serve_page();

}  // namespace troupe
