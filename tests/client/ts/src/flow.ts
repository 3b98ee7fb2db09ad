// The nvim/vim flow, typed by the schema openapi-typescript generates from openapi/openapi.json.
// Type-checked under `strict` (tsc --noEmit); run with node against `carryover serve` when
// CARRYOVER_URL is set. No non-null assertion anywhere: the answers' fields are required.
import createClient from "openapi-fetch";
import type { components, paths } from "./schema.js";

type Context = components["schemas"]["Context-Output"];

export async function flow(baseUrl: string, apiKey: string): Promise<number[]> {
  const client = createClient<paths, "application/json">({
    baseUrl,
    headers: { Authorization: `Bearer ${apiKey}` },
  });

  const created = await client.POST("/conversations", {
    body: { system_prompt: "You are concise." },
  });
  if (created.error !== undefined) throw new Error(JSON.stringify(created.error));
  const id: string = created.data.id;

  const first = await client.POST("/conversations/{conversation_id}/runs", {
    params: { path: { conversation_id: id } },
    body: { prompts: ["What is nvim?"] },
  });
  if (first.error !== undefined) throw new Error(JSON.stringify(first.error));
  const context: Context | null | undefined = first.data.context; // left out by Prefer: return=minimal
  const afterFirst: number = context == null ? -1 : context.messages.length;
  const etag: string | null = first.data.etag;
  if (etag === null) throw new Error("the first run stored nothing");

  const second = await client.POST("/conversations/{conversation_id}/runs", {
    params: { path: { conversation_id: id }, header: { "If-Match": etag } },
    body: { prompts: [{ type: "user", content: [{ type: "text", text: "How does it differ from vim?" }] }] },
  });
  if (second.error !== undefined) throw new Error(JSON.stringify(second.error));
  const data = second.data;
  const lengths = [afterFirst, data.context == null ? -1 : data.context.messages.length];

  const stored = await client.GET("/conversations/{conversation_id}/context", {
    params: { path: { conversation_id: id } },
  });
  if (stored.error !== undefined) throw new Error(JSON.stringify(stored.error));
  // context.messages is required in the answer: no `!`, no optional chaining
  lengths.push(stored.data.messages.length);
  const usage: number = data.usage.output_tokens; // every Usage field is present
  if (usage < 0) throw new Error("negative usage");
  return lengths;
}

const url = process.env["CARRYOVER_URL"];
const key = process.env["CARRYOVER_API_KEY"];
if (url !== undefined && key !== undefined) {
  flow(url, key).then(
    (lengths) => console.log(JSON.stringify(lengths)),
    (error: unknown) => {
      console.error(error);
      process.exit(1);
    },
  );
}
