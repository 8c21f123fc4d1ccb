#include <algorithm>
#include <string>
#include <string_view>

#include "pscore/comm/http_internal.h"

// Request parsing for HttpServer: http-parser's callbacks, with the header and body limits
// checked as the bytes arrive, and the request target split into path and query.

namespace pscore::comm {
namespace {

HttpServer::Conn* ConnOf(http_parser* p) { return static_cast<HttpServer::Conn*>(p->data); }

int CountHeader(HttpServer::Conn* c, size_t n, size_t limit) {
  c->header_bytes += n;
  if (c->header_bytes <= limit) return 0;
  c->fail_status = 431;
  return -1;
}

void FlushHeader(HttpServer::Conn* c) {
  if (c->field.empty()) return;
  std::string name = c->field;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
  c->req.headers[name] = c->value;
  c->field.clear();
  c->value.clear();
}

std::string PercentDecode(std::string_view in) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '+') {
      out += ' ';
    } else if (in[i] == '%' && i + 2 < in.size() &&
               isxdigit(static_cast<unsigned char>(in[i + 1])) &&
               isxdigit(static_cast<unsigned char>(in[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(in.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += in[i];
    }
  }
  return out;
}

}  // namespace

bool ParseTarget(const std::string& url, HttpRequest* req) {
  http_parser_url u;
  http_parser_url_init(&u);
  if (http_parser_parse_url(url.data(), url.size(), 0, &u) != 0) return false;
  if (!(u.field_set & (1 << UF_PATH))) return false;
  req->path = url.substr(u.field_data[UF_PATH].off, u.field_data[UF_PATH].len);
  if (!(u.field_set & (1 << UF_QUERY))) return true;
  std::string_view q(url.data() + u.field_data[UF_QUERY].off, u.field_data[UF_QUERY].len);
  while (!q.empty()) {
    size_t amp = q.find('&');
    std::string_view pair = q.substr(0, amp);
    q = amp == std::string_view::npos ? std::string_view() : q.substr(amp + 1);
    if (pair.empty()) continue;
    size_t eq = pair.find('=');
    std::string key = PercentDecode(pair.substr(0, eq));
    req->query[key] = eq == std::string_view::npos ? "" : PercentDecode(pair.substr(eq + 1));
  }
  return true;
}

const http_parser_settings& HttpSettings() {
  static http_parser_settings s = [] {
    http_parser_settings st;
    http_parser_settings_init(&st);
    st.on_message_begin = [](http_parser* p) {
      HttpServer::Conn* c = ConnOf(p);
      c->in_request = true;
      c->request_started = SteadyClock().Now();
      c->req = HttpRequest();
      c->url.clear();
      c->field.clear();
      c->value.clear();
      c->last_was_value = false;
      c->header_bytes = 0;
      return 0;
    };
    st.on_url = [](http_parser* p, const char* at, size_t n) {
      HttpServer::Conn* c = ConnOf(p);
      c->url.append(at, n);
      return CountHeader(c, n, c->server->options().max_header_bytes);
    };
    st.on_header_field = [](http_parser* p, const char* at, size_t n) {
      HttpServer::Conn* c = ConnOf(p);
      if (c->last_was_value) FlushHeader(c);
      c->last_was_value = false;
      c->field.append(at, n);
      return CountHeader(c, n, c->server->options().max_header_bytes);
    };
    st.on_header_value = [](http_parser* p, const char* at, size_t n) {
      HttpServer::Conn* c = ConnOf(p);
      c->last_was_value = true;
      c->value.append(at, n);
      return CountHeader(c, n, c->server->options().max_header_bytes);
    };
    st.on_headers_complete = [](http_parser* p) {
      HttpServer::Conn* c = ConnOf(p);
      FlushHeader(c);
      if ((p->flags & F_CONTENTLENGTH) && p->content_length > c->server->options().max_body_bytes) {
        c->fail_status = 413;
        return -1;
      }
      return 0;
    };
    st.on_body = [](http_parser* p, const char* at, size_t n) {
      HttpServer::Conn* c = ConnOf(p);
      if (c->req.body.size() + n > c->server->options().max_body_bytes) {
        c->fail_status = 413;
        return -1;
      }
      c->req.body.append(at, n);
      return 0;
    };
    st.on_message_complete = [](http_parser* p) {
      HttpServer::Conn* c = ConnOf(p);
      c->req.method = http_method_str(static_cast<http_method>(p->method));
      c->req.keep_alive = http_should_keep_alive(p) != 0;
      c->head_only = p->method == HTTP_HEAD;
      c->in_request = false;
      c->ready = true;
      http_parser_pause(p, 1);  // one request at a time: Feed resumes after the answer
      return 0;
    };
    return st;
  }();
  return s;
}

}  // namespace pscore::comm
