// Renders Markdown as an editor's hover would, for the hostile-input tests: reads
// {"linkify": bool, "texts": [...]} on stdin and writes the JSON array of their HTML. markdown-it
// (CommonMark, VS Code's Markdown engine) with raw HTML switched ON: the worst case for escaping.
const MarkdownIt = require("markdown-it");
let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => { input += chunk; });
process.stdin.on("end", () => {
  const request = JSON.parse(input);
  const md = new MarkdownIt({ html: true, linkify: Boolean(request.linkify) });
  process.stdout.write(JSON.stringify(request.texts.map((text) => md.render(text))));
});
