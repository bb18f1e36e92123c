// `fathom mcp sqlite`: queries on one SQLite database in the workspace. Read-only (the connection
// is opened read-only and every statement is checked with sqlite3_stmt_readonly) unless the
// manifest passes --allow-writes. Results are text tables with a row limit. One statement per
// call; a progress handler enforces the timeout and cancellation.
#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <memory>
#include <mutex>

#include "agent/builtins.h"
#include "agent/workspace_fs.h"
#include "base/strings.h"
#include "base/timer.h"

namespace fathom::agent {
namespace {

using json = nlohmann::json;

struct Db {
  sqlite3* db = nullptr;
  std::mutex mu;  // one statement at a time on the connection
  SqlitePluginOptions options;
  ~Db() {
    if (db) sqlite3_close_v2(db);
  }
};

struct Deadline {
  Timer timer;
  int64_t timeout_ms;
  const std::atomic<bool>* cancel;
};

std::string cell_text(sqlite3_stmt* st, int i) {
  switch (sqlite3_column_type(st, i)) {
    case SQLITE_NULL:
      return "NULL";
    case SQLITE_BLOB:
      return fmt::format("<blob {} bytes>", sqlite3_column_bytes(st, i));
    default: {
      std::string s(reinterpret_cast<const char*>(sqlite3_column_text(st, i)),
                    static_cast<size_t>(sqlite3_column_bytes(st, i)));
      for (char& c : s)
        if (c == '\n' || c == '|') c = ' ';
      return s.size() > 200 ? s.substr(0, 200) + "..." : s;
    }
  }
}

Status bind_params(sqlite3_stmt* st, const json& params) {
  for (size_t i = 0; i < params.size(); ++i) {
    const json& p = params[i];
    const int idx = static_cast<int>(i) + 1;
    int rc = SQLITE_OK;
    if (p.is_null())
      rc = sqlite3_bind_null(st, idx);
    else if (p.is_number_integer())
      rc = sqlite3_bind_int64(st, idx, p.get<int64_t>());
    else if (p.is_number())
      rc = sqlite3_bind_double(st, idx, p.get<double>());
    else if (p.is_boolean())
      rc = sqlite3_bind_int(st, idx, p.get<bool>() ? 1 : 0);
    else if (p.is_string())
      rc = sqlite3_bind_text(st, idx, p.get_ref<const std::string&>().c_str(), -1, SQLITE_TRANSIENT);
    else
      return invalid_argument("params[{}]: only null, numbers, booleans and strings can be bound", i);
    if (rc != SQLITE_OK) return invalid_argument("params[{}]: {}", i, sqlite3_errstr(rc));
  }
  return {};
}

ToolOutput run_query(Db& d, const std::string& sql, const json& params, int64_t max_rows,
                     const std::atomic<bool>* cancel) {
  std::lock_guard<std::mutex> lock(d.mu);
  Deadline deadline{Timer(), d.options.timeout_ms, cancel};
  sqlite3_progress_handler(
      d.db, 1000,
      [](void* p) -> int {
        auto* dl = static_cast<Deadline*>(p);
        return (dl->cancel && dl->cancel->load()) ||
               dl->timer.elapsed_ms() > static_cast<double>(dl->timeout_ms);
      },
      &deadline);
  sqlite3_stmt* st = nullptr;
  const char* tail = nullptr;
  if (sqlite3_prepare_v2(d.db, sql.c_str(), static_cast<int>(sql.size()), &st, &tail) != SQLITE_OK)
    return tool_error(fmt::format("SQL error: {}", sqlite3_errmsg(d.db)));
  std::unique_ptr<sqlite3_stmt, int (*)(sqlite3_stmt*)> guard(st, sqlite3_finalize);
  if (!st) return tool_error("empty SQL statement");
  if (tail && !trim(tail).empty() && trim(tail) != ";")
    return tool_error("only one SQL statement per call; found more after: " +
                      std::string(trim(tail)).substr(0, 80));
  if (!d.options.allow_writes && !sqlite3_stmt_readonly(st))
    return tool_error(
        "this database is read-only for the agent (the plugin manifest does not grant writes); statement "
        "refused");
  if (Status s = bind_params(st, params); !s.ok()) return tool_error(s.message());
  const int cols = sqlite3_column_count(st);
  std::vector<std::string> header;
  for (int i = 0; i < cols; ++i) header.emplace_back(sqlite3_column_name(st, i));
  std::vector<std::vector<std::string>> rows;
  int64_t total = 0;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (++total > max_rows) continue;
    std::vector<std::string> row;
    for (int i = 0; i < cols; ++i) row.push_back(cell_text(st, i));
    rows.push_back(std::move(row));
  }
  if (rc == SQLITE_INTERRUPT)
    return tool_error(cancel && cancel->load()
                          ? "query cancelled"
                          : fmt::format("query exceeded the {} ms timeout", d.options.timeout_ms));
  if (rc != SQLITE_DONE) return tool_error(fmt::format("SQL error: {}", sqlite3_errmsg(d.db)));
  if (cols == 0) return ToolOutput{.text = fmt::format("ok, {} row(s) changed", sqlite3_changes(d.db))};
  std::vector<size_t> width(static_cast<size_t>(cols));
  for (int i = 0; i < cols; ++i) width[i] = header[i].size();
  for (const auto& r : rows)
    for (int i = 0; i < cols; ++i) width[i] = std::max(width[i], r[i].size());
  auto line = [&](const std::vector<std::string>& r) {
    std::string s = "|";
    for (int i = 0; i < cols; ++i) s += " " + r[i] + std::string(width[i] - r[i].size(), ' ') + " |";
    return s + "\n";
  };
  std::string out = line(header) + "|";
  for (int i = 0; i < cols; ++i) out += std::string(width[i] + 2, '-') + "|";
  out += "\n";
  for (const auto& r : rows) out += line(r);
  out += total > max_rows ? fmt::format("({} rows, {} shown: max_rows {})\n", total, max_rows, max_rows)
                          : fmt::format("({} row{})\n", total, total == 1 ? "" : "s");
  return ToolOutput{.text = out};
}

}  // namespace

Result<std::vector<ServerTool>> sqlite_tools(const SqlitePluginOptions& o) {
  if (o.database.empty()) return invalid_argument("--db is required");
  Workspace ws = TRY(Workspace::open(o.workspace));
  // Confine the database like any other path, then open it by its real name.
  int fd = TRY(ws.open_at(o.database, o.allow_writes ? O_RDWR | O_CREAT : O_RDONLY));
  ::close(fd);
  auto d = std::make_shared<Db>();
  d->options = o;
  const std::string path = ws.root() + "/" + TRY(ws.relative(o.database));
  const int flags = (o.allow_writes ? SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE : SQLITE_OPEN_READONLY) |
                    SQLITE_OPEN_FULLMUTEX;
  if (sqlite3_open_v2(path.c_str(), &d->db, flags, nullptr) != SQLITE_OK)
    return io_error("sqlite: cannot open {}: {}", path, d->db ? sqlite3_errmsg(d->db) : "out of memory");
  sqlite3_busy_timeout(d->db, 2000);
  const json str = {{"type", "string"}};
  std::vector<ServerTool> tools;
  tools.push_back(
      {"query",
       fmt::format("Run one SQL statement on {} ({}); results as a table of at most max_rows rows. "
                   "Use ? placeholders with params.",
                   o.database, o.allow_writes ? "read-write" : "read-only"),
       {{"type", "object"},
        {"properties",
         {{"sql", str},
          {"params", {{"type", "array"}}},
          {"max_rows", {{"type", "integer"}, {"minimum", 1}, {"maximum", 10000}}}}},
        {"required", {"sql"}},
        {"additionalProperties", false}},
       [d](const json& a, ToolContext& ctx) {
         return run_query(*d, a["sql"], a.value("params", json::array()),
                          a.value("max_rows", d->options.max_rows), ctx.cancelled);
       }});
  tools.push_back({"list_tables",
                   "List the tables and views of the database.",
                   {{"type", "object"}, {"properties", json::object()}, {"additionalProperties", false}},
                   [d](const json&, ToolContext& ctx) {
                     return run_query(
                         *d,
                         "SELECT name, type FROM sqlite_schema WHERE type IN ('table','view') AND name "
                         "NOT LIKE 'sqlite_%' ORDER BY name",
                         json::array(), 10000, ctx.cancelled);
                   }});
  tools.push_back({"describe_table",
                   "Show a table's columns (name, type, not null, default, primary key).",
                   {{"type", "object"},
                    {"properties", {{"table", str}}},
                    {"required", {"table"}},
                    {"additionalProperties", false}},
                   [d](const json& a, ToolContext& ctx) {
                     return run_query(
                         *d, "SELECT name, type, \"notnull\", dflt_value, pk FROM pragma_table_info(?)",
                         json::array({a["table"]}), 10000, ctx.cancelled);
                   }});
  return tools;
}

}  // namespace fathom::agent
