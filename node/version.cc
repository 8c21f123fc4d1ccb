#include "node/version.h"

namespace pscore::node {

const char* Version() { return "0.1.0"; }

}  // namespace pscore::node
