// Library version, for --version and the admin status line.
#pragma once

namespace pscore::node {

const char* Version();

}  // namespace pscore::node
