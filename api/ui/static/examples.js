// Examples for the schema and tool editors; the first schema is the README's.
export const SCHEMAS = {
  person: {
    type: "object", additionalProperties: false, required: ["name", "born"],
    properties: {
      name: { type: "string", maxLength: 40 },
      born: { type: "integer", minimum: 1800, maximum: 1900 },
    },
  },
  weather: {
    type: "object", additionalProperties: false, required: ["city", "temperature_c", "sky"],
    properties: {
      city: { type: "string", maxLength: 40 },
      temperature_c: { type: "number", minimum: -60, maximum: 60 },
      sky: { enum: ["clear", "cloudy", "rain", "snow"] },
    },
  },
  shopping_list: {
    type: "object", additionalProperties: false, required: ["items"],
    properties: {
      items: {
        type: "array", minItems: 1, maxItems: 5,
        items: {
          type: "object", additionalProperties: false, required: ["name", "quantity"],
          properties: { name: { type: "string", maxLength: 30 }, quantity: { type: "integer", minimum: 1, maximum: 12 } },
        },
      },
    },
  },
};

export const TOOLS = [
  {
    type: "function",
    function: {
      name: "get_weather", description: "Current weather in a city",
      parameters: { type: "object", required: ["city"], properties: { city: { type: "string", maxLength: 40 } } },
    },
  },
  {
    type: "function",
    function: {
      name: "get_time", description: "Local time in a timezone",
      parameters: { type: "object", required: ["timezone"], properties: { timezone: { type: "string", maxLength: 40 } } },
    },
  },
];
