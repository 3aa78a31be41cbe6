/**
 * Types for `./vendor/uPlot.esm.js`, the URL the console imports uPlot from. The route plugin
 * (src/http/routes/console.ts) serves that URL from the uplot package; this file only lets the
 * type checker follow the import to the package's own declarations. It is never served.
 */
import uPlot from 'uplot'
export default uPlot
