"""A stand-in LLM API that reads request bodies the way Python services do.

FastAPI (Starlette's Request.json()) and vLLM's OpenAI server read a body with
json.loads on its bytes: UTF-8 with or without a BOM, UTF-16 and UTF-32 (told apart by
their zero bytes) are all accepted, so are NaN and Infinity, lone surrogates in string
escapes, and a key given twice (the last one wins). Whatever weir estimates and clamps
from a body, this is what a model server of that kind does with it: the witness of the
differential checks in tests/tests/hostile/bodies.rs (tests/src/py_upstream.rs starts it).

POST: the body is read (content-length or chunked), parsed with json.loads, and the
request's bound on output is recorded: the largest of max_tokens,
max_completion_tokens and max_output_tokens, as Python reads them. The answer is an
OpenAI chat completion whose usage is the prompt (`x-llm-usage`) plus what a model that
would write `x-llm-output` tokens writes within that bound. A body json.loads refuses,
or a bound that is not a number, is answered 400, as an API would.

GET /__received: every request so far, as JSON (one object each, in arrival order).

Usage: python3 py_upstream.py PORT   (prints "ready" once it listens)
"""

import http.server
import json
import math
import sys
import threading

FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")

received = []
lock = threading.Lock()


def bound_of(value):
    """The largest max-token field Python reads, None if the body sets none."""
    if not isinstance(value, dict):
        raise ValueError("the body is not a JSON object")
    bounds = []
    for field in FIELDS:
        v = value.get(field)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"{field} is not a number: {v!r}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{field} is {v!r}")
        bounds.append(int(v))
    return max(bounds) if bounds else None


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def read_body(self):
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def answer(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path != "/__received":
            return self.answer(404, {"error": "POST a chat completion"})
        with lock:
            return self.answer(200, received)

    def do_POST(self):
        body = self.read_body()
        record = {
            "headers": {k.lower(): v for k, v in self.headers.items() if k.lower().startswith("x-")},
            "body_bytes": len(body),
            "bound": None,
            "error": None,
        }
        try:
            record["bound"] = bound_of(json.loads(body))
        except (ValueError, UnicodeDecodeError) as e:
            record["error"] = str(e)
        with lock:
            received.append(record)
        if record["error"] is not None:
            return self.answer(400, {"error": {"message": record["error"]}})
        prompt = int(self.headers.get("x-llm-usage") or 0)
        output = int(self.headers.get("x-llm-output") or 0)
        if record["bound"] is not None:
            output = min(output, record["bound"])
        self.answer(200, {
            "id": "chatcmpl-py",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": output,
                "total_tokens": prompt + output,
            },
        })


def main():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
