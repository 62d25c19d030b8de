// Rank 0's job-wide inspector answers (flight, stacks; engine/flight_report.hpp) from every
// process's part. The other processes' parts arrive over the network: anything may be in them.
#pragma once
#include <string>
#include <vector>

namespace troupe {

// `mine` ({KEY: [entry...]}, this process's part) with the KEY entries of the other processes'
// answers, sorted by the integer member `order` of the entries (stable: equal ones keep their
// order). An answer that is not such a document ({"error": ...}, not JSON, another shape) is
// listed in `unreachable` with the reason, as is a count of entries without an integer `order`
// (they are dropped); the result has "unreachable" when the list is not empty. Never throws.
std::string merge_answers(const std::string& mine, const std::vector<std::string>& answers,
                          const std::string& key, const std::string& order,
                          std::vector<std::string> unreachable);

}  // namespace troupe
