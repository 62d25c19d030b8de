// FeedBook (model/decode_work.hpp): apart from decode_work.cpp, whose parser the fuzz build links
// without the decoder (plan_feed is the decoder's).
#include "model/decode_work.hpp"

namespace troupe {

Status FeedBook::accept(const DecodeWork& w) {
  std::map<int, int64_t> next = length_;
  for (const SlotOp& op : w.ops) {
    const bool open = next.count(op.id) != 0, from_open = next.count(op.from) != 0;
    const bool allowed = op.kind == SlotOp::close ? open : !open && (op.kind != SlotOp::copy || from_open);
    if (!allowed)
      return Status::bad_input("a decode feed from rank 0 " +
                               std::string(op.kind == SlotOp::open ? "opens" : op.kind == SlotOp::close ? "closes" : "copies into") +
                               " sequence " + std::to_string(op.id) + ", which its sequences do not allow");
    if (op.kind == SlotOp::close) next.erase(op.id);
    else next[op.id] = op.kind == SlotOp::copy ? next.at(op.from) : 0;
  }
  if (!w.rows.ids.empty()) {
    auto rows = plan_feed(config_, w.rows.ids, w.tokens, [&](int id) { return next.count(id) != 0; },
                          [&](int id) { return next.at(id); });
    if (!rows) return rows.status().with_context("a decode feed from rank 0: ");
  }
  for (size_t i = 0; i < w.rows.ids.size(); ++i) next[w.rows.ids[i]] += static_cast<int64_t>(w.tokens[i].size());
  length_ = std::move(next);
  return Status::ok();
}

}  // namespace troupe
