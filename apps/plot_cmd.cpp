// troupe plot: draws the loss curve of a --metrics-file as an SVG (opens in any browser or viewer):
// training loss per iteration as a line, validation loss as dots, log-scaled nothing, axes with ticks.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "apps/commands.hpp"
#include "apps/report.hpp"

#include <sys/stat.h>

#include "storage/durable.hpp"
#include "storage/temp_file.hpp"

namespace troupe::apps {

namespace {

struct Point {
  double x, y;
};

struct Series {
  std::vector<Point> train, validation;
};

Result<Series> read_metrics(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::error("--metrics-file " + path + " cannot be read -- pass the file troupe train wrote");
  Series s;
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return Status::error(path + " line " + std::to_string(number) + " is not a JSON object -- pass a --metrics-file");
    if (j.contains("lm_loss") && j.contains("iteration"))
      s.train.push_back({j["iteration"].get<double>(), j["lm_loss"].get<double>()});
    if (j.contains("validation_loss") && j.contains("iteration"))
      s.validation.push_back({j["iteration"].get<double>(), j["validation_loss"].get<double>()});
  }
  if (s.train.empty()) return Status::error(path + " holds no training iterations -- nothing to plot");
  return s;
}

// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `target` ticks over `span`.
double tick_step(double span, int target) {
  const double raw = span / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

std::string render_svg(const Series& s, const std::string& title) {
  const double W = 800, H = 480, left = 70, right = 20, top = 40, bottom = 50;
  double x0 = 0, x1 = 1, y0 = 1e300, y1 = -1e300;
  for (const auto* v : {&s.train, &s.validation})
    for (const Point& p : *v) {
      x1 = std::max(x1, p.x);
      y0 = std::min(y0, p.y);
      y1 = std::max(y1, p.y);
    }
  const double pad = (y1 - y0) * 0.05 + 1e-9;
  y0 = std::max(0.0, y0 - pad);
  y1 += pad;
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * (W - left - right); };
  auto py = [&](double y) { return H - bottom - (y - y0) / (y1 - y0) * (H - top - bottom); };
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"24\" font-size=\"15\">{3}</text>\n",
      W, H, left, title);
  const double xs = tick_step(x1 - x0, 8), ys = tick_step(y1 - y0, 6);
  for (double x = std::ceil(x0 / xs) * xs; x <= x1 + 1e-9; x += xs)
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#eee\"/>"
                       "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4:g}</text>\n",
                       px(x), top, H - bottom, H - bottom + 16, x);
  for (double y = std::ceil(y0 / ys) * ys; y <= y1 + 1e-9; y += ys)
    svg += fmt::format("<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#eee\"/>"
                       "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5:g}</text>\n",
                       left, py(y), W - right, left - 6, py(y) + 4, y);
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", left, top,
                     W - left - right, H - top - bottom);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">iteration</text>\n", (left + W - right) / 2, H - 12);
  svg += fmt::format("<text transform=\"translate(18,{}) rotate(-90)\" text-anchor=\"middle\">loss (nats/token)</text>\n",
                     (top + H - bottom) / 2);
  std::string path;
  for (const Point& p : s.train) path += fmt::format("{}{:.1f},{:.1f} ", path.empty() ? "M" : "L", px(p.x), py(p.y));
  svg += "<path d=\"" + path + "\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\"/>\n";
  for (const Point& p : s.validation)
    svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" fill=\"#d62728\"/>\n", px(p.x), py(p.y));
  svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#1f77b4\" stroke-width=\"2\"/>"
                     "<text x=\"{3}\" y=\"{4}\">training loss</text>\n",
                     W - 200, top + 16, W - 180, W - 175, top + 20);
  if (!s.validation.empty())
    svg += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"4\" fill=\"#d62728\"/><text x=\"{}\" y=\"{}\">validation loss</text>\n",
                       W - 190, top + 36, W - 175, top + 40);
  return svg + "</svg>\n";
}

}  // namespace

void add_plot_command(CLI::App& app, int* exit_code) {
  auto metrics = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("plot", "Draw the loss curve of a --metrics-file as SVG");
  cmd->add_option("--metrics-file", *metrics, "JSON lines written by troupe train --metrics-file")->required();
  cmd->add_option("--output", *output, "SVG file to write")->required();
  cmd->callback([metrics, output, exit_code] {
    auto series = read_metrics(*metrics);
    if (!series) {
      print_error("plot", series.status());
      *exit_code = kExitUsage;
      return;
    }
    // A fresh temporary (never a planted file or symlink), renamed into place.
    const std::string svg = render_svg(series.value(), "troupe: " + std::filesystem::path(*metrics).filename().string());
    if (Status st = write_text_atomically(*output, svg); !st) {
      print_error("plot", st);
      *exit_code = kExitFailure;
      return;
    }
    (void)::chmod(output->c_str(), default_file_mode());
    std::printf("troupe plot: wrote %s (%zu iterations, %zu validation points)\n", output->c_str(),
                series.value().train.size(), series.value().validation.size());
    *exit_code = kExitOk;
  });
}

}  // namespace troupe::apps
