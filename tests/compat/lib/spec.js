// Validates real HTTP answers against openapi/*.yaml with ajv: the status must be documented
// for the operation, the media type must be documented for that status, the body must match
// the schema, and every field of the body must be declared (unless the schema is open).
import Ajv from 'ajv';
import addFormats from 'ajv-formats';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import YAML from 'yaml';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');

const ajv = new Ajv({ allErrors: true, strict: true, strictTypes: false });
addFormats(ajv);
ajv.addFormat('binary', true); // OpenAPI's "binary string" (a raw body)
// OpenAPI 3.0 annotation keywords (ajv supports `nullable` itself), and the OpenAPI document's
// own top-level fields, so that the whole document can be added as one schema and every
// "#/components/..." reference resolves inside it.
ajv.addVocabulary(['example', 'xml', 'externalDocs', 'openapi', 'info', 'servers', 'tags',
  'security', 'paths', 'components']);

const pointerEscape = (s) => s.replace(/~/g, '~0').replace(/\//g, '~1');

function resolvePointer(doc, ref) {
  if (!ref.startsWith('#/')) throw new Error(`external $ref not supported: ${ref}`);
  return ref.slice(2).split('/').map((p) => p.replace(/~1/g, '/').replace(/~0/g, '~'))
    .reduce((node, key) => {
      if (node === undefined || !(key in node)) throw new Error(`dangling $ref ${ref}`);
      return node[key];
    }, doc);
}

/** One OpenAPI document, ready to validate answers of its operations. */
export class Spec {
  /** @param {string} rel path of the YAML file from the project root, e.g. openapi/gateway.yaml */
  constructor(rel) {
    this.id = `urn:chunkgate:${rel.replace(/[^A-Za-z0-9]/g, '_')}`;
    this.doc = YAML.parse(fs.readFileSync(path.join(ROOT, rel), 'utf8'));
    ajv.addSchema(this.doc, this.id);
    this.validators = new Map();
  }

  validator(pointer) {
    let v = this.validators.get(pointer);
    if (!v) {
      v = ajv.compile({ $ref: `${this.id}#${pointer}` });
      this.validators.set(pointer, v);
    }
    return v;
  }

  check(pointer, body, what) {
    const v = this.validator(pointer);
    if (!v(body)) {
      const errs = v.errors.map((e) => `${e.instancePath || '(root)'} ${e.message}` +
        (e.params && Object.keys(e.params).length ? ` ${JSON.stringify(e.params)}` : ''));
      throw new Error(`${what}: does not match ${pointer}:\n  ${errs.join('\n  ')}\n` +
        `body: ${JSON.stringify(body).slice(0, 2000)}`);
    }
    const extra = [];
    undeclared(this.doc, resolvePointer(this.doc, `#${pointer}`), body, '', extra);
    if (extra.length) {
      throw new Error(`${what}: fields not in ${pointer}: ${extra.join(', ')}\n` +
        `body: ${JSON.stringify(body).slice(0, 2000)}`);
    }
  }

  /** Checks a body against components/schemas/<name>. */
  checkSchema(name, body, what = name) {
    this.check(`/components/schemas/${name}`, body, what);
  }

  /**
   * Checks one answer of an operation.
   * @param {string} method  get, post, delete
   * @param {string} route   the path template as in the spec, e.g. /v1/chunks/{key}
   * @param {number} status  the HTTP status received
   * @param {string} contentType the Content-Type header received
   * @param {*} body parsed JSON (or the text, for non-JSON media types)
   */
  checkResponse(method, route, status, contentType, body) {
    const what = `${method.toUpperCase()} ${route} -> ${status}`;
    const pathItem = this.doc.paths[route];
    if (!pathItem) throw new Error(`${what}: route not in the spec`);
    const op = pathItem[method];
    if (!op) throw new Error(`${what}: method not in the spec`);
    const codes = [String(status), `${String(status)[0]}XX`, 'default'];
    const code = codes.find((c) => c in op.responses);
    if (!code) throw new Error(`${what}: status not documented (documented: ${Object.keys(op.responses)})`);
    let pointer = `/paths/${pointerEscape(route)}/${method}/responses/${code}`;
    let resp = op.responses[code];
    if (resp.$ref) {
      pointer = resp.$ref.slice(1);
      resp = resolvePointer(this.doc, resp.$ref);
    }
    const media = (contentType || '').split(';')[0].trim().toLowerCase();
    if (!resp.content || !(media in resp.content)) {
      throw new Error(`${what}: media type "${media}" not documented ` +
        `(documented: ${Object.keys(resp.content || {})})`);
    }
    const schema = resp.content[media].schema;
    if (!schema) return;
    if (Buffer.isBuffer(body)) {
      if (schema.type !== 'string' || schema.format !== 'binary') {
        throw new Error(`${what}: a binary body, but the spec's schema is not a binary string`);
      }
      return;
    }
    this.check(`${pointer}/content/${pointerEscape(media)}/schema`, body, what);
  }
}

// Collects the paths of object fields that the schema does not declare. An object schema is
// open when it has no `properties` or says `additionalProperties`; allOf branches are merged;
// for oneOf/anyOf the declared fields of every branch count.
function undeclared(doc, schema, data, at, out) {
  if (data === null || typeof data !== 'object' || !schema) return;
  const props = {};
  let open = false;
  let sawProps = false;
  const items = [];
  const visit = (s) => {
    if (s.$ref) s = resolvePointer(doc, s.$ref);
    if (s.properties) {
      sawProps = true;
      for (const [k, v] of Object.entries(s.properties)) (props[k] ||= []).push(v);
    }
    if (s.additionalProperties !== undefined && s.additionalProperties !== false) open = true;
    if (s.items) items.push(s.items);
    for (const k of ['allOf', 'oneOf', 'anyOf']) (s[k] || []).forEach(visit);
  };
  visit(schema);
  if (Array.isArray(data)) {
    data.forEach((d, i) => items.forEach((s) => undeclared(doc, s, d, `${at}[${i}]`, out)));
    return;
  }
  if (!sawProps) return;
  for (const [k, v] of Object.entries(data)) {
    if (props[k]) props[k].forEach((s) => undeclared(doc, s, v, `${at}.${k}`, out));
    else if (!open) out.push(`${at}.${k}`);
  }
}

const loaded = new Map();
const load = (rel) => {
  if (!loaded.has(rel)) loaded.set(rel, new Spec(rel));
  return loaded.get(rel);
};
/** The project's two specs (each loaded once per process). */
export const gatewaySpec = () => load('openapi/gateway.yaml');
export const workerSpec = () => load('openapi/worker.yaml');
