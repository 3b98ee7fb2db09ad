// The official `openai` package for Node, unmodified, on Carryover's /v1 (docs/openai.md):
// a conversation carried over two responses, its items in order, the streaming helper to its
// final response, a function tool round trip, and errors as the SDK's classes. Type-checked
// under `strict` with the package's own types; run with node against `carryover serve` when
// CARRYOVER_URL is set. Prints one JSON line: what the Python test compares.
import OpenAI from "openai";

export async function openaiFlow(baseURL: string, apiKey: string): Promise<unknown> {
  const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0 });

  const conversation = await client.conversations.create({ metadata: { sdk: "node" } });
  const first = await client.responses.create({
    model: "default",
    input: "What is nvim?",
    conversation: conversation.id,
  });
  const second = await client.responses.create({
    model: "default",
    input: "And vim?",
    conversation: conversation.id,
  });

  const roles: string[] = [];
  for await (const item of client.conversations.items.list(conversation.id, { order: "asc" })) {
    roles.push(item.type === "message" ? item.role : item.type);
  }

  const stream = client.responses.stream({
    model: "default",
    input: "stream me",
    conversation: conversation.id,
  });
  const types: string[] = [];
  for await (const event of stream) types.push(event.type);
  const streamed = await stream.finalResponse();

  const asked = await client.responses.create({
    model: "default",
    input: '/tool get_weather {"city": "Lima"}',
    conversation: conversation.id,
    tools: [
      {
        type: "function",
        name: "get_weather",
        parameters: { type: "object", properties: { city: { type: "string" } } },
        strict: false,
      },
    ],
  });
  const call = asked.output[0];
  if (call === undefined || call.type !== "function_call") throw new Error("no function call");
  const answered = await client.responses.create({
    model: "default",
    input: [{ type: "function_call_output", call_id: call.call_id, output: "warm" }],
    conversation: conversation.id,
  });

  let refused = "";
  try {
    await client.responses.create({ model: "nope", input: "x" });
  } catch (error: unknown) {
    if (error instanceof OpenAI.BadRequestError) refused = `${error.status} ${error.code ?? ""}`;
  }
  let missing = 0;
  try {
    await client.responses.retrieve("resp_missing");
  } catch (error: unknown) {
    if (error instanceof OpenAI.NotFoundError) missing = error.status;
  }

  return {
    texts: [first.output_text, second.output_text, streamed.output_text, answered.output_text],
    roles,
    first: types[0],
    last: types[types.length - 1],
    arguments: call.arguments,
    refused,
    missing,
  };
}

const url = process.env["CARRYOVER_URL"];
const key = process.env["CARRYOVER_API_KEY"];
if (url !== undefined && key !== undefined && process.argv[1]?.endsWith("openai_flow.js")) {
  openaiFlow(url, key).then(
    (found) => console.log(JSON.stringify(found)),
    (error: unknown) => {
      console.error(error);
      process.exit(1);
    },
  );
}
