// HTTP/1.1 heads, chunked framing and header rewriting (proxy/http1.hpp).
#include "proxy/http1.hpp"

#include <gtest/gtest.h>
