"""A real HTTP server for the fleet pull tests: serves the files under ROOT with a strong
ETag (sha256 of the body), answers 304 when If-None-Match matches, 404 for a missing file,
and appends "PATH CODE" to LOG for each request. Usage: etag_server.py ROOT PORT LOG"""

import hashlib
import http.server
import os
import sys

ROOT, PORT, LOG = sys.argv[1], int(sys.argv[2]), sys.argv[3]


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        rel = self.path.split("?", 1)[0].lstrip("/")
        path = os.path.join(ROOT, rel)
        if ".." in rel.split("/") or not os.path.isfile(path):
            code = 404
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            with open(path, "rb") as f:
                body = f.read()
            etag = '"%s"' % hashlib.sha256(body).hexdigest()
            if self.headers.get("If-None-Match") == etag:
                code = 304
                self.send_response(code)
                self.send_header("ETag", etag)
                self.end_headers()
            else:
                code = 200
                self.send_response(code)
                self.send_header("ETag", etag)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
        with open(LOG, "a") as f:
            f.write("%s %d\n" % (self.path, code))

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
