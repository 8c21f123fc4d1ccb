// The flags every program takes (pscore-node, pscore-train and pscore-admin): where the
// scheduler is and how to authenticate to it. Defined in common_flags.cc, which is linked
// into each program; each program's own flags live in <program>_flags.cc, linked only into
// it, so that gflags (one flag table per binary) knows, lists and accepts only them.
// Also the parsing steps every program shares. Main thread, at start.
#pragma once

#include <gflags/gflags.h>

#include <cstdint>
#include <string>

#include "programs/flags.h"

DECLARE_string(scheduler_host);
DECLARE_int32(scheduler_port);
DECLARE_uint64(max_message_bytes);
DECLARE_string(cluster_token_file);
DECLARE_string(tls_cert);
DECLARE_string(tls_key);
DECLARE_string(tls_ca);

namespace pscore::node::flags {

// Prints "<prog>: <msg>" on stderr and exits 2 (kExitUsage).
[[noreturn]] void Die(const std::string& prog, const std::string& msg);

// The steps every program starts with: refuses an unknown flag or a value of the wrong
// type (exit 2, one line), parses argv (removing the flags), answers --help with `usage`
// and the program's flags (exit 0), --version and --helpfull as gflags does, and fills
// every flag not given from PSCORE_<FLAG>. Returns the program's name for error lines.
std::string ParseCommandLine(int* argc, char*** argv, const char* usage);

// Whether flag `name` was given (on the command line or as PSCORE_<FLAG>).
bool Given(const char* name);

// Exit 2 unless `v` is a port, [0, 65535].
void CheckPort(const std::string& prog, const char* name, int v);
// Exit 2 unless `v` is in [min, kMaxTimeoutMs]: the int64 durations become steady-clock
// deadlines (now + ms), and more than 2^42 ms (about 139 years) would overflow them.
void CheckMs(const std::string& prog, const char* name, int64_t v, int64_t min);
// Exit 2 on --max_message_bytes < 1024.
void CheckMaxMessageBytes(const std::string& prog);

// Reads --cluster_token_file and loads the three --tls_* files into cl (exit 2 on a file
// that cannot be read, an empty token, or TLS files that do not load).
void LoadSecrets(const std::string& prog, CommandLine* cl);

// The scheduler's address and the frame limit, into cl->node.
void FillSchedulerLink(CommandLine* cl);

}  // namespace pscore::node::flags
