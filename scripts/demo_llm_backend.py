#!/usr/bin/env python3
"""A tiny stand-in for an LLM API, for config/examples/token-budget.toml: it
reports the tokens each call used in X-Tokens-Used, which the proxy charges.
Usage: demo_llm_backend.py [PORT] [HOST] (default 9001 127.0.0.1).

POST /v1/completions with a JSON body {"prompt": "...", "max_tokens": N,
"stream": false}. The "model" writes exactly max_tokens (default 16, at most
32768) tokens, so the count is deterministic: tokens used = the prompt's
words + max_tokens. The answer is JSON with OpenAI's "usage" object and the
field X-Tokens-Used; with "stream": true it is server-sent events in a chunked
body, and the count comes last, as a trailer (it is known only at the end).
A request it cannot serve (another path, a bad body) is answered 404 or 400
with X-Tokens-Used: 0: it used nothing, so it is charged nothing."""
import http.server
import json
import socket
import sys

MAX_TOKENS = 32768


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # Head and body leave in separate writes: no Nagle delay between them.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _json(self, status, obj, tokens):
        body = json.dumps(obj).encode() + b"\n"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Tokens-Used", str(tokens))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.split("?")[0] != "/v1/completions":
            return self._json(404, {"error": "try POST /v1/completions"}, 0)
        try:
            req = json.loads(body or b"{}")
            prompt = str(req.get("prompt", ""))
            max_tokens = int(req.get("max_tokens", 16))
            if not 1 <= max_tokens <= MAX_TOKENS:
                raise ValueError(f"max_tokens must be between 1 and {MAX_TOKENS}")
        except (ValueError, TypeError, AttributeError) as e:
            return self._json(400, {"error": str(e)}, 0)
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": max_tokens}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        text = " ".join(["blah"] * max_tokens)
        if not req.get("stream"):
            return self._json(200, {"object": "text_completion", "choices": [{"text": text}], "usage": usage},
                              usage["total_tokens"])
        # Streaming: one event per 1,000 tokens, then the count as a trailer.
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Trailer", "X-Tokens-Used")
        self.end_headers()
        words = text.split(" ")
        events = [json.dumps({"choices": [{"text": " ".join(words[i:i + 1000])}]}) for i in range(0, len(words), 1000)]
        for data in events + [json.dumps({"usage": usage}), "[DONE]"]:
            chunk = f"data: {data}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.wfile.write(b"0\r\nX-Tokens-Used: %d\r\n\r\n" % usage["total_tokens"])

    def do_GET(self):
        self._json(404, {"error": "try POST /v1/completions"}, 0)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 9001
    host = sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1"
    http.server.ThreadingHTTPServer((host, port), Handler).serve_forever()
